"""Task assets: the format, the store, the factory, the quality gate, splits."""

"""Tasks as environments over the network (`tryloop serve env`); see docs/serve.md."""

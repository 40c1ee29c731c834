"""tryloop on the network: tasks as environments (`tryloop serve env`) and the local model over the
OpenAI API (`tryloop serve model`); see docs/serve.md."""

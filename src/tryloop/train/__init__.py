"""Training: group advantages, the clipped policy loss, batching, and the update step.

Heavy imports (torch, transformers, peft) stay in the submodules, so that
`import tryloop.train.config` works without the `train` extra.
"""

"""Demo-only code: the SmolLM2 demo model, tiny random checkpoints, random adapters, and the
demo tenant of `loraplex serve --demo`. Nothing in the engine or the serving path imports it.

Import the modules themselves (`loraplex.platform.demo.checkpoint`, ...): this package
re-exports nothing, so that tests and benchmarks that only build a checkpoint do not pull in
the database stack of `bootstrap`.
"""

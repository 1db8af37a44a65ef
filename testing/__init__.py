"""What the tests and benchmarks run against, never shipped with Cachet: a scripted OpenAI-compatible model
server, llama.cpp servers on generated GGUF models, and chat templates. Nothing in the product imports it."""

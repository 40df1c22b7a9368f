"""specstudy: decide, with evidence, whether speculative decoding should be enabled for a vLLM deployment."""

__version__ = "0.1.0"

"""atgrpo: AT-GRPO for multi-agent LLM teams."""
__version__ = "0.1.0"

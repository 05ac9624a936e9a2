"""The OpenAI-compatible HTTP surface: endpoints, wire format, prompts into tokens, API keys."""

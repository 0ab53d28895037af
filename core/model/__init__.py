"""The model: Claude through the anthropic SDK, the offline stand-in, the prompt, speech to text."""

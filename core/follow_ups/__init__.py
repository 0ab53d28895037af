"""Follow-ups: the agent messages the person later, on its own."""

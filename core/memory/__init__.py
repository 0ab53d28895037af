"""A person's thread: stored, read back, searched, condensed, corrected, forgotten."""

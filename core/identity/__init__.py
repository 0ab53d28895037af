"""Who is writing: the identity policy, linking apps to one person, web tokens."""

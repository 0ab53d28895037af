"""Where the memory lives: the store protocol and its two stores (Postgres, Supabase), and the
embedded database of `make dev` and the tests.
"""

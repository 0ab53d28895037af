"""Operator tooling, never uploaded with the functions: the `crossmem` command, local development
and its demo page, the deploy, its package, and the checks of a live deployment.
"""

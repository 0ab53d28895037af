"""The fixed phrases a person reads (welcome, linking, forgetting, the budget's pause, the
fallback, media refusals...), in their language: catalogue.py reads them, language.py chooses
the language, and each language is one TOML file here (en.toml, es.toml)."""

"""When a batch goes: dedupe, debounce, cooldown and budget as pure functions of a model's state (rules.py),
and the values they work on (state.py)."""

"""Precompile: the orchestrator (`run`), its plan and recipe, one module per stage."""

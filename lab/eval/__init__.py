"""Downstream evaluation of a run: HumanEval completions by the harness's own decoder, executed in a sandbox."""

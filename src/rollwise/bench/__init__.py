"""``rollwise compare``: arms × seeds on one budget (``sweep``), run or resumed (``runner``),
summarised with confidence intervals (``analysis``) into ``compare.json``, a plot and an HTML
report (``report``). One call: ``rollwise.bench.compare("benchmarks/example_sweep.toml")``.
"""


def compare(*args, **kwargs) -> dict:
    from rollwise.bench.runner import compare as _compare

    return _compare(*args, **kwargs)

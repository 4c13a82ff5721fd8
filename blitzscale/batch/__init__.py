"""`blitzscale batch`: a sweep of live runs from one TOML template (design §7).

    template.py  the template format (read its docstring first) and its checks
    traces.py    one trace of a template: where it comes from, how it is shaped
    plan.py      the cross product: one `RunSpec` (id, ServeConfig, trace) per run
    store.py     what a batch directory holds, so a later batch can resume from it
    runner.py    running the plan: one live cluster per run, failures recorded, resume
    report.py    the comparison over all runs: rich tables and comparison.csv
    plot.py      comparison.png

The command line is blitzscale/cli/batch.py; an example template is configs/batch.example.toml.
"""

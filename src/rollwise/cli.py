"""Command line: ``rollwise train | eval | compare | config show`` (typer). Each command is one
Python call (``rollwise.train(cfg)``, ``rollwise.evaluate(run_dir)``, ``rollwise.bench.compare(sweep)``,
``load_config``). User errors print a one-paragraph message naming the culprit and exit with
status 2, without a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from rollwise.registry import UserError

app = typer.Typer(add_completion=False, no_args_is_help=False, help="rollwise: compute-efficient RLVR for language models.")
config_app = typer.Typer(help="Inspect configuration.")
app.add_typer(config_app, name="config")
console = Console()

ConfigOpt = typer.Option(None, "--config", "-c", help="TOML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override: section.key=value (repeatable).")


def _load(config: Optional[Path], overrides: Optional[List[str]], resume: Optional[Path] = None):
    from rollwise.config import load_config

    if resume is not None:
        resolved = resume / "config.resolved.toml"
        if not resolved.is_file():
            raise UserError(f"cannot resume {resume}: no config.resolved.toml there")
        base = [f"run.dir={resume.parent.as_posix()!r}".replace("'", '"'), f'run.name="{resume.name}"']
        return load_config(config or resolved, base + list(overrides or []))
    return load_config(config, overrides or [])


@app.command()
def train(config: Optional[Path] = ConfigOpt, set: Optional[List[str]] = SetOpt,
          resume: Optional[Path] = typer.Option(None, "--resume", help="Resume runs/<name> from its latest checkpoint.")):
    """Train. With no arguments: the embedded default (arithmetic task, tiny model, CPU)."""
    import rollwise

    cfg = _load(config, set, resume)
    console.print(f"[bold]rollwise[/] run [cyan]{cfg.run_dir()}[/] — task {cfg.task.name}, model {cfg.model.name}, "
                  f"controller {cfg.control.name}, objective {cfg.objective.name}, {cfg.train.steps} steps")
    result = rollwise.train(cfg, resume=resume is not None, log=lambda m: console.print(f"[dim]{m}[/]"))
    console.print(f"[green]done[/]: {result.summary()}")
    console.print(f"files: {result.run_dir}/ (metrics.jsonl, eval.jsonl, plots/, checkpoints/)")


@app.command("eval")
def eval_cmd(run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>).")):
    """Evaluate a run's latest checkpoint on its held-out split."""
    import rollwise

    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    m = rollwise.evaluate(run_dir, log=lambda s: console.print(f"[dim]{s}[/]"))
    for k, v in m.items():
        console.print(f"{k:24s} {v}")


@app.command()
def compare(config: Path = typer.Option(..., "--config", "-c", help="Sweep file (benchmarks/<name>.toml): base config, arms, seeds, budget."),
            set: Optional[List[str]] = typer.Option(None, "--set", "-s", help="Override for every arm: section.key=value (repeatable)."),
            out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="Runs and report directory (default: the sweep's out_dir)."),
            jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,
                                               help="Runs trained at once in separate processes (default: the sweep's jobs).")):
    """Run arms x seeds on one budget (skipping finished runs, resuming interrupted ones); write compare.json and report.html."""
    from rollwise.bench import compare as run_compare

    if not config.is_file():
        raise UserError(f"sweep file not found: {config}")
    result = run_compare(config, set or [], out_dir, jobs, log=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True))
    out = Path(result["sweep"]["out_dir"])
    t = result["target"]["value"]
    console.print(f"[bold]target pass@1 {t:.3f}[/] ({result['target']['source']})")
    for arm, a in result["arms"].items():
        m = a["metrics"]
        ttt = m["tokens_to_target"]["value"]
        console.print(f"  {arm:20s} tokens to target {'not reached' if ttt is None else f'{ttt:,.0f}':>12s}   "
                      f"AUC {m['auc']['value']:.3f}   final pass@1 {m['final_pass@1']['value']:.3f}", markup=False, highlight=False,
                      soft_wrap=True)
    console.print(f"files: {out / 'compare.json'}, {out / 'report.html'}", soft_wrap=True)


@config_app.command("show")
def config_show(config: Optional[Path] = ConfigOpt, set: Optional[List[str]] = SetOpt):
    """Print the resolved configuration as TOML."""
    from rollwise.config import to_toml

    console.print(to_toml(_load(config, set)), markup=False, highlight=False)


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=False)
    except UserError as e:
        console.print(f"[bold red]error:[/] {e}", markup=True, highlight=False)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        console.print("[red]aborted[/]")
        sys.exit(130)
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()

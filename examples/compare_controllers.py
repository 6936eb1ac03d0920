"""`rollwise compare` of two controllers from Python: arms x seeds on one budget, then the report.

    python examples/compare_controllers.py                       # examples/compare_controllers.toml
    python examples/compare_controllers.py train.steps=3         # section.key=value for every arm

Writes compare.json, a plot and report.html under runs/compare/controllers (tokens and seconds to the
target pass@1, the area under the curve, final pass@1, each over the seeds with an interval); the
same as `rollwise compare --config examples/compare_controllers.toml`. Finished runs are skipped and
interrupted ones resumed when it is run again.
"""

import sys
from pathlib import Path

from rollwise.bench import compare

SWEEP = Path(__file__).with_name("compare_controllers.toml")


def main(argv=None, out_dir=None):
    result = compare(SWEEP, list(sys.argv[1:] if argv is None else argv), out_dir, log=print)
    for arm, a in result["arms"].items():
        m = a["metrics"]
        print(f"{arm:10s} AUC {m['auc']['value']:.3f}  final pass@1 {m['final_pass@1']['value']:.3f}")
    return result


if __name__ == "__main__":
    main()

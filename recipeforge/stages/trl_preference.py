"""What the ORPO, CPO and KTO runners share: finding TRL's trainer and building it.

TRL moves trainers between `trl.experimental.<name>` and the top level across releases, leaving a
deprecated subclass at the old place: in trl 1.0 ORPO and CPO live in `trl.experimental` only, and
`trl.KTOTrainer` wraps `trl.experimental.kto`; in later releases KTO is top level and the
experimental name wraps it. `trl_classes` looks in both places and takes the class the others
derive from, so no deprecation path (and its warning) is used whatever the installed release.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from transformers import Trainer, TrainingArguments

# Where each trainer may live: the stable API first, then the experimental module.
TRL_LOCATIONS = {
    "ORPO": ("trl", "trl.experimental.orpo"),
    "CPO": ("trl", "trl.experimental.cpo"),
    "KTO": ("trl", "trl.experimental.kto"),
}


def trl_classes(method: str, *, stage: str | None = None) -> tuple[type, type]:
    """(`<method>Config`, `<method>Trainer`) from the installed TRL, e.g. ``trl_classes("ORPO")``.

    Raises a `RecipeError` naming the installed version when no location has both classes.
    """
    modules = TRL_LOCATIONS[method]
    found: list[tuple[type, type]] = []
    for name in modules:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # importing trl.experimental warns that it is experimental
                module = importlib.import_module(name)
                config = getattr(module, f"{method}Config", None)
                trainer = getattr(module, f"{method}Trainer", None)
        except (ImportError, RuntimeError):  # RuntimeError: TRL's lazy module failing to import a member
            continue
        if isinstance(config, type) and isinstance(trainer, type):
            found.append((config, trainer))
    if not found:
        from importlib import metadata

        try:
            version = f"trl {metadata.version('trl')}"
        except metadata.PackageNotFoundError:
            version = "no trl"
        raise RecipeError(f"stage {stage or method.lower()} trains with TRL's {method}Trainer, which the installed "
                          f"{version} does not have (looked in {' and '.join(modules)})", key="stage",
                          hint="install a supported TRL: pip install 'trl>=1.0,<1.17'")
    # A deprecated location holds a subclass of the real class: take the one every other derives from.
    for config, trainer in found:
        if all(issubclass(t, trainer) for _, t in found):
            return config, trainer
    return found[0]


class PreferenceSection(Protocol):
    """What the shared runner reads of a stage's section (`ORPOConfig`, `CPOConfig`, `KTOConfig`)."""

    @property
    def max_prompt_length(self) -> int | None: ...


class PreferenceTrainerStage(TrainerStage):
    """A runner on one of TRL's ORPO / CPO / KTO trainers; the stage's section is `recipe.<stage>`."""

    method: str = ""  # key of TRL_LOCATIONS

    @property
    def section(self) -> PreferenceSection:
        section: PreferenceSection = getattr(self.recipe, self.stage)
        return section

    def prepare_data(self) -> PreparedData:
        return self.prepare_rows("preference", max_prompt_length=self.section.max_prompt_length)

    def method_arguments(self) -> dict[str, Any]:
        """The stage's own config fields (beta, loss, weights)."""
        raise NotImplementedError

    def trainer_arguments(self) -> dict[str, Any]:
        """Extra constructor arguments of the trainer (KTO: the reference model)."""
        return {}

    def trainer_config(self) -> TrainingArguments:
        """TRL's config of the stage: common settings, the stage's section, lengths, the backend's."""
        from recipeforge.stages.trl_lengths import length_arguments

        config_cls, _ = trl_classes(self.method, stage=self.stage)
        # Every length limit comes from the recipe: prompts are cut by <stage>.max_prompt_length
        # (recipeforge cuts them itself, in prepare_data), whole sequences by data.sequence_len; the
        # completion limit stays open. A TRL default (ORPO and CPO fall back to 512 tokens) never applies.
        lengths = length_arguments(config_cls, max_length=self.recipe.data.sequence_len,
                                   max_prompt_length=self.section.max_prompt_length, max_completion_length=None)
        num_proc = self.recipe.data.num_proc  # a number once the recipe is loaded (`auto` is resolved then)
        return self.training_arguments(config_cls, **self.method_arguments(), **lengths, disable_dropout=True,
                                       dataset_num_proc=num_proc if isinstance(num_proc, int) and num_proc > 1
                                       else None)

    def build_trainer(self) -> Trainer:
        from recipeforge.outputs.atomic import crash_safe

        _, trainer_cls = trl_classes(self.method, stage=self.stage)
        args = self.trainer_config()
        return crash_safe(trainer_cls)(model=self.model, args=args, train_dataset=self.train_rows,
                                       eval_dataset=self.eval_rows, processing_class=self.tokenizer,
                                       peft_config=self.peft_config(), callbacks=self.callbacks(),
                                       **self.trainer_arguments())

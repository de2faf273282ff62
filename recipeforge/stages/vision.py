"""SFT and DPO of vision-language models, on TRL's `SFTTrainer` and `DPOTrainer` with the model's
processor as their processing class.

Images cannot ride in the pre-tokenized data of the text SFT stage: TRL's vision collators
(`DataCollatorForVisionLanguageModeling`, DPO's own) open, resize and tokenize them per batch. The
rows are in TRL's vision form (`components.vision_data.vision_rows`): ``{"messages", "images"}`` for
SFT, ``{"prompt", "chosen", "rejected", "images"}`` for DPO, images as local paths.

SFT's loss is on the assistant replies only (`assistant_only_loss`: the chat template's
``{% generation %}`` marks), so the image tokens, which sit in the user turns, never carry loss.
Packing is refused: packed rows share position ids and the image grids of several samples, which the
vision models' position and image-feature code does not separate. `sft.py` and `dpo.py` hand a
recipe whose model is a VLM to the runners here; the rest (arguments, callbacks, LoRA, freezing,
saving the processor) is `TrainerStage`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import Stage
from recipeforge.stages.base import TrainerStage
from recipeforge.plan.vision_stages import PACKING_WITH_IMAGES

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.config.schema.data import DatasetSpec

# The dataset formats each vision stage reads, and the `vision_rows` kind they become.
VISION_FORMATS: dict[str, tuple[str, str]] = {Stage.SFT: ("messages", "messages"),
                                              Stage.DPO: ("preference", "preference")}


class VisionStage(TrainerStage):
    """What the VLM runners share: the processor, the image rows, the packing refusal."""

    takes_images = True

    def check(self) -> None:
        super().check()
        check_libraries(self.stage)
        if self.recipe.data.packing:
            raise RecipeError(PACKING_WITH_IMAGES, key="data.packing", location=self.ctx.locate(("data", "packing")),
                              hint="set data.packing: false")

    def prepare(self) -> PreparedData:
        from recipeforge.components.vision_model import load_processor

        check_libraries(self.stage)  # data may be prepared before `check` runs (preprocess, the launcher)
        if self.recipe.data.streaming:
            raise RecipeError("image rows are read whole (every image is checked before training); streaming is for "
                              "text corpora", key="data.streaming", location=self.ctx.locate(("data", "streaming")),
                              hint="set data.streaming: false")
        self.tokenizer = self.load_tokenizer()
        self.processor = load_processor(self.recipe, self.tokenizer, location=self.ctx.locate(("model", "name_or_path")))
        self.data = self.prepare_data()
        self.ctx.log(self.data.describe())
        return self.data

    def prepare_data(self) -> PreparedData:
        """The recipe's datasets as TRL vision rows (every image checked), eval held out as asked."""
        import datasets

        data = self.recipe.data
        train = self._read("datasets", data.datasets)
        evaluation = self._read("eval_datasets", data.eval_datasets) if data.eval_datasets else None
        if evaluation is None and data.val_size:
            held = data.val_size if data.val_size >= 1 else max(1, round(len(train) * data.val_size))
            split = datasets.Dataset.from_list(train).train_test_split(test_size=int(held),
                                                                        seed=self.recipe.train.seed)
            train_ds, eval_ds = split["train"], split["test"]
        else:
            train_ds = datasets.Dataset.from_list(train)
            eval_ds = datasets.Dataset.from_list(evaluation) if evaluation else None
        images = sum(len(i or ()) for i in train_ds["images"])
        stats = {"train_rows": len(train_ds), "eval_rows": len(eval_ds) if eval_ds is not None else 0,
                 "train_images": images}
        return PreparedData(train=train_ds, eval=eval_ds, stats=stats, unit="rows with images")

    def _read(self, section: str, specs: Sequence[DatasetSpec]) -> list[dict[str, Any]]:
        from recipeforge.components.data import DatasetRef, load_raw, resolve_local
        from recipeforge.components.vision_data import image_base_dir, vision_rows

        wanted, kind = VISION_FORMATS[self.stage]
        rows: list[dict[str, Any]] = []
        for i, spec in enumerate(specs):
            ref = DatasetRef(spec, section, i)
            if spec.format != wanted:
                raise RecipeError(f"stage {self.stage} of a vision-language model reads '{wanted}' rows with images, "
                                  f"not '{spec.format}'", key=f"{ref.key}.format",
                                  location=self.ctx.locate(ref.path_key + ("format",)),
                                  hint=f"set format: {wanted} (image entries in the message contents)")
            local = resolve_local(ref, base_dir=self.ctx.base_dir, locate=self.ctx.locate)
            raw = load_raw(ref, base_dir=self.ctx.base_dir, locate=self.ctx.locate)
            if spec.max_samples:
                raw = raw.shuffle(seed=self.recipe.train.seed).select(range(min(spec.max_samples, len(raw))))
            source = local if local is not None else spec.path
            # Relative paths start at the recipe's folder; a recipe without a file (built in Python) has
            # none, and its paths start at the working directory, as its dataset paths do (`local_path`).
            # Without a local dataset file `image_base_dir` reads only `image_root`; without either, the
            # images start at the recipe's folder.
            recipe_dir = self.ctx.base_dir if self.ctx.base_dir is not None else Path.cwd()
            base = (image_base_dir(local if local is not None else recipe_dir, spec.image_root, recipe_dir=recipe_dir)
                    if local is not None or spec.image_root else recipe_dir)
            rows += vision_rows(raw.to_list(), source=source, base_dir=base,
                                kind=kind, image_column=spec.images,
                                location=self.ctx.locate(ref.path_key + ("path",)), embedded_dir=self._image_dir())
        return rows

    def _image_dir(self) -> Path:
        """Where images held in the data itself (hub datasets' Image columns) are kept as files: beside
        the tokenized-data cache, named by content, shared by runs."""
        from recipeforge.components.lm_data import default_cache_root

        cache = self.recipe.data.cache_dir
        return (Path(cache).expanduser() if cache else default_cache_root()) / "images"

    def finish_trainer(self) -> None:
        super().finish_trainer()
        self.check_images()

    def check_images(self) -> None:
        """One row per distinct image-count/size shape, encoded as training will: the image tokens
        must match what the model makes of the images, and no row may be cut by data.sequence_len."""
        raise NotImplementedError


class VisionSFTStage(VisionStage):
    """SFT of a VLM on TRL's `SFTTrainer`: loss on the assistant replies, images per batch."""

    stage = Stage.SFT
    trainer_class = "trl.SFTTrainer"

    def build_trainer(self) -> Trainer:
        from trl import SFTConfig, SFTTrainer

        from recipeforge.components.vision_model import check_template
        from recipeforge.outputs.atomic import crash_safe

        check_template(self.processor, location=self.ctx.locate(("data", "chat_template")))
        args = self.training_arguments(SFTConfig, max_length=self.recipe.data.sequence_len, packing=False,
                                       padding_free=False, assistant_only_loss=True, remove_unused_columns=False,
                                       dataset_kwargs={"skip_prepare_dataset": True})
        return crash_safe(SFTTrainer)(model=self.model, args=args, train_dataset=self.train_rows,
                                      eval_dataset=self.eval_rows, processing_class=self.processor,
                                      peft_config=self.peft_config(), callbacks=self.callbacks())

    def check_images(self) -> None:
        from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

        from recipeforge.components.vision_model import check_image_tokens

        # The trainer's collator, without its cut: the check sees whole rows.
        collate = DataCollatorForVisionLanguageModeling(processor=self.processor, max_length=None,
                                                        assistant_only_loss=True)
        check_image_tokens(collate, distinct_rows(self.train_rows), self.trainer.model.config,
                           self.processor.tokenizer.convert_tokens_to_ids(self.processor.image_token),
                           self.recipe.data.sequence_len)


# TRL limits the loss to assistant replies on image rows only with this transformers (the chat
# template's assistant mask for processors); recipeforge trains VLMs with that mask only.
VISION_TRANSFORMERS_MIN = "5.18.0"


def check_libraries(stage: str) -> None:
    """Refuse, before anything loads, a transformers or TRL too old for images in `stage`."""
    from importlib.metadata import version

    from packaging.version import Version

    installed = version("transformers")
    if Version(installed) < Version(VISION_TRANSFORMERS_MIN):
        raise RecipeError(f"stage {stage} with a vision-language model needs transformers >= {VISION_TRANSFORMERS_MIN} "
                          f"(installed: {installed}) to limit the loss to the assistant replies of image rows",
                          key="model.name_or_path", hint=f"pip install 'transformers>={VISION_TRANSFORMERS_MIN}'")
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    if "assistant_only_loss" not in getattr(DataCollatorForVisionLanguageModeling, "__dataclass_fields__", {}):
        raise RecipeError(f"stage {stage} with a vision-language model needs a TRL whose vision collator masks "
                          f"everything but the assistant replies (trl {version('trl')} has none)",
                          key="model.name_or_path", hint="pip install -U 'trl<1.17'")


def distinct_rows(rows: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) for the first row of each distinct (image count, image sizes) shape."""
    from PIL import Image

    seen: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
    out = []
    for i, row in enumerate(rows):
        sizes: list[tuple[int, int]] = []
        for path in row.get("images") or ():
            with Image.open(path) as img:
                sizes.append(img.size)
        shape = (len(sizes), tuple(sizes))
        if shape not in seen:
            seen.add(shape)
            out.append((f"training row {i + 1}", row))
    return out

"""Axolotl's model, adapter, optimisation, precision, backend, logging and output keys as recipe keys (the
stage and its settings: `stages.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.config.axolotl.values import num

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

OPTIMIZERS = {"adamw_torch": "adamw", "adamw_hf": "adamw", "adamw": "adamw", "adamw_torch_fused": "adamw_fused",
              "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
              "paged_adamw_32bit": "paged_adamw_32bit", "adafactor": "adafactor", "sgd": "sgd",
              "lion_8bit": "lion_8bit", "paged_lion_8bit": "lion_8bit",
              # torchao's low-bit AdamW: transformers' names, and Axolotl's own
              "adamw_torch_8bit": "adamw_torchao_8bit", "adamw_torchao_8bit": "adamw_torchao_8bit",
              "ao_adamw_8bit": "adamw_torchao_8bit", "adamw_torch_4bit": "adamw_torchao_4bit",
              "adamw_torchao_4bit": "adamw_torchao_4bit", "ao_adamw_4bit": "adamw_torchao_4bit"}
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant",
              "constant_with_warmup": "constant_with_warmup", "cosine_with_min_lr": "cosine_with_min_lr",
              "warmup_stable_decay": "wsd"}
ATTENTION_FLAGS = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
                   "flex_attention": "flex_attention"}
ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
DECODER_LINEARS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
                             "gate_up_proj", "w1", "w2", "w3", "wq", "wk", "wv", "wo", "fc1", "fc2", "dense",
                             "dense_h_to_4h", "dense_4h_to_h", "query_key_value", "c_attn", "c_proj", "c_fc",
                             "out_proj"})
# Axolotl 0.19.0 defaults that differ from recipeforge's (axolotl/utils/schemas/config.py).
AXOLOTL_SEQUENCE_LEN = 512


def model(conv: Conversion) -> None:
    conv.put("model.name_or_path", conv.get("base_model"), "base_model")
    for src, dst in (("revision_of_model", "model.revision"), ("tokenizer_config", "model.tokenizer"),
                     ("trust_remote_code", "model.trust_remote_code")):
        if conv.get(src) is not None:
            conv.put(dst, conv.get(src), src)
    if conv.get("trust_remote_code") is True:
        conv.note("trust_remote_code", "model.trust_remote_code: true runs the model repository's Python code, "
                                       "which recipeforge does only after an explicit opt-in: pass --trust-code "
                                       "or set allow_code: true")
    loads = ("a vision-language model with AutoModelForImageTextToText and its processor with AutoProcessor"
             if conv.vision else "the model with AutoModelForCausalLM and the tokenizer with AutoTokenizer")
    for src in ("model_type", "tokenizer_type", "base_model_config", "tokenizer_use_fast", "tokenizer_legacy"):
        if conv.get(src) is not None and src not in conv.mapped and src not in conv.notes:
            conv.note(src, f"not needed: recipeforge loads {loads} from model.name_or_path (or model.tokenizer)")
    if conv.get("random_init_weights") is not None:
        conv.put("model.init", "random" if conv.get("random_init_weights") is True else "pretrained",
                 "random_init_weights")
    bf16 = conv.get("bf16", conv.get("bfloat16"))
    fp16 = conv.get("fp16", conv.get("float16"))
    dtype = ("bf16" if bf16 is True else "auto" if bf16 == "auto" else "fp16" if fp16 is True
             else "fp32" if False in (bf16, fp16) else None)
    if dtype is not None:
        conv.put("model.dtype", dtype)
    for src in ("bf16", "fp16", "bfloat16", "float16"):
        if conv.get(src) is not None:
            conv.map(src, "model.dtype")
    if conv.get("tf32") is not None:
        conv.put("train.tf32", conv.get("tf32") if isinstance(conv.get("tf32"), bool) else "auto", "tf32")
    attn = conv.get("attn_implementation")
    if attn is not None:
        if attn in ATTENTION:
            conv.put("model.attn_implementation", attn, "attn_implementation")
        else:
            conv.note("attn_implementation", f"'{attn}' has no counterpart; model.attn_implementation is auto "
                                             f"(flash_attention_2 when installed on a GPU, else sdpa)")
    for flag, impl in ATTENTION_FLAGS.items():
        if conv.get(flag) is True and "model" in conv.recipe and "attn_implementation" not in conv.recipe["model"]:
            conv.put("model.attn_implementation", impl, flag)
        elif conv.get(flag) is not None and flag not in conv.mapped:
            conv.map(flag, "model.attn_implementation")
    for flag in ("xformers_attention", "sage_attention", "s2_attention"):
        if conv.get(flag):
            conv.note(flag, "no counterpart; model.attn_implementation is auto (flash_attention_2 or sdpa)")
    if conv.get("sequence_len") is not None:
        conv.put("data.sequence_len", num(conv.get("sequence_len"), int, "sequence_len"), "sequence_len")
    else:  # Axolotl's default, not recipeforge's 2048
        conv.put("data.sequence_len", AXOLOTL_SEQUENCE_LEN)


def adapter(conv: Conversion) -> None:
    kind = conv.get("adapter")
    four, eight = bool(conv.get("load_in_4bit")), bool(conv.get("load_in_8bit"))
    for src in ("load_in_4bit", "load_in_8bit"):
        if conv.get(src) is not None:
            conv.map(src, "adapter.quant.bits")
    if kind is None:
        if four or eight:
            conv.note("load_in_4bit" if four else "load_in_8bit",
                      "quantized loading without an adapter has no counterpart (a quantized base cannot be "
                      "trained in full); the recipe fine-tunes in full precision")
        return
    if kind not in ("lora", "qlora"):
        conv.note("adapter", f"'{kind}' has no counterpart; the recipe uses LoRA (adapter.type: lora)")
    elif "adapter" not in conv.notes:
        conv.map("adapter", "adapter.type")
    quantized = kind == "qlora" or four or eight
    conv.put("adapter.type", "qlora" if quantized else "lora")
    if quantized:
        conv.put("adapter.quant.bits", 8 if eight and not four else 4)
    for src, dst in (("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"),
                     ("lora_modules_to_save", "modules_to_save"), ("peft_use_dora", "use_dora"),
                     ("peft_use_rslora", "use_rslora")):
        if conv.get(src) is not None:
            conv.put(f"adapter.{dst}", conv.get(src), src)
    modules = conv.get("lora_target_modules")
    if isinstance(modules, str):
        modules = _target_regex(conv, modules) if any(c in modules for c in ".*[]()|\\") else [modules]
    if conv.get("lora_target_linear"):
        conv.put("adapter.target_modules", "all-linear", "lora_target_linear")
        if modules:
            conv.map("lora_target_modules", "adapter.target_modules")
            # Axolotl adapts the union of the listed names and every linear layer but the output layer; peft's
            # all-linear is that second set, so only names outside it are lost.
            beyond = [str(m) for m in modules if str(m) not in DECODER_LINEARS]
            if beyond:
                conv.change("lora_target_modules",
                            f"Axolotl puts LoRA on {', '.join(beyond)} as well as on every linear layer "
                            f"(lora_target_linear); the recipe's all-linear leaves {'them' if len(beyond) > 1 else 'it'} "
                            f"out (peft's all-linear skips the output layer): list the model's linear layers and "
                            f"{', '.join(beyond)} under adapter.target_modules, e.g. [q_proj, k_proj, v_proj, o_proj, "
                            f"gate_proj, up_proj, down_proj, {', '.join(beyond)}]")
            else:
                conv.note("lora_target_modules", "listed next to lora_target_linear: all-linear already covers them")
    elif modules:
        conv.put("adapter.target_modules", list(modules), "lora_target_modules")
    elif conv.get("lora_target_linear") is False:
        conv.put("adapter.target_modules", "all-linear", "lora_target_linear")
        conv.note("lora_target_linear", "false without lora_target_modules: the recipe targets all-linear")
    bnb = conv.get("bnb_config_kwargs") or {}
    if isinstance(bnb, dict):
        for src, dst in (("bnb_4bit_quant_type", "quant_type"), ("bnb_4bit_use_double_quant", "double_quant")):
            if src in bnb:
                conv.put(f"adapter.quant.{dst}", bnb[src], f"bnb_config_kwargs.{src}")
        for k in bnb:
            if k not in ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant"):
                conv.note(f"bnb_config_kwargs.{k}", "no counterpart (compute dtype follows model.dtype)")
        if bnb:
            conv.map("bnb_config_kwargs", "adapter.quant")
    for src in ("lora_model_dir", "lora_fan_in_fan_out", "lora_on_cpu", "peft_layers_to_transform"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; the recipe starts new adapters on every targeted module")


def _target_regex(conv: Conversion, pattern: str) -> list[str]:
    """A `lora_target_modules` regular expression (PEFT matches it against full module paths) as the
    module names it ends in, e.g. ``model.language_model.layers.[\\d]+.(mlp|self_attn).(up|q)_proj`` as
    [up_proj, q_proj]; a pattern that does not end in literal names is kept as one name, reported."""
    from recipeforge.config.axolotl.vision import parts, path_restricts, target_names

    found = target_names(pattern)
    if found is None:
        conv.note("lora_target_modules", f"PEFT reads '{pattern}' as a regular expression; recipeforge takes module "
                                         f"names, so the recipe lists it as one name: replace it with the names")
        return [pattern]
    names, path = found
    why = (f"PEFT reads '{pattern}' as a regular expression; recipeforge takes module names, so the recipe lists "
           f"the names it ends in ({', '.join(names)})")
    if path_restricts(path):
        why += (f"; its path '{path}' selects only some modules of those names, which names cannot say: every "
                f"module of those names gets an adapter")
    if conv.vision is not None:
        named = parts(path)
        if "tower" in named:
            why += "; its path names the vision tower, so model.vision.train_tower is true (adapters there too)"
        elif "language" in named:
            why += ("; its path keeps them on the language model, as recipeforge does while "
                    "model.vision.train_tower is false")
    conv.note("lora_target_modules", why)
    return names


def optimisation(conv: Conversion) -> None:
    """Batch sizes, run length, hyperparameters, optimizer, scheduler, checkpointing and the loss watchdog."""
    # The order of the steps is the order of the converted keys in the recipe and its report.
    _batch_sizes(conv)
    _run_length(conv)
    _hyperparameters(conv)
    _optimizer(conv)
    unfrozen(conv)
    _scheduler(conv)
    _checkpointing(conv)
    _eval_save_notes(conv)
    loss_watchdog(conv)


def _batch_sizes(conv: Conversion) -> None:
    """`micro_batch_size` x `gradient_accumulation_steps` x world size (or `batch_size`) as the global batch."""
    micro = conv.get("micro_batch_size")
    accum = num(conv.get("gradient_accumulation_steps", 1), int, "gradient_accumulation_steps")
    if micro is not None:
        micro = num(micro, int, "micro_batch_size")
        conv.put("train.micro_batch_size", micro, "micro_batch_size")
        conv.put("train.global_batch_size", micro * accum * conv.world_size, "micro_batch_size")
        if conv.get("gradient_accumulation_steps") is not None:
            conv.map("gradient_accumulation_steps", "train.global_batch_size")
        conv.note("gradient_accumulation_steps" if conv.get("gradient_accumulation_steps") else "micro_batch_size",
                  f"global batch = {micro} x {accum} x world size {conv.world_size} = "
                  f"{micro * accum * conv.world_size} (train.global_batch_size); the planner picks the "
                  f"accumulation for the hardware it plans for")
    elif conv.get("batch_size") is not None:
        conv.put("train.global_batch_size", num(conv.get("batch_size"), int, "batch_size"), "batch_size")
    if conv.get("batch_size") is not None and micro is not None:
        conv.note("batch_size", "ignored next to micro_batch_size (as Axolotl does)")


def _run_length(conv: Conversion) -> None:
    """`num_epochs` and `max_steps`."""
    if conv.get("num_epochs") is not None:
        conv.put("train.epochs", num(conv.get("num_epochs"), float, "num_epochs"), "num_epochs")
    if conv.get("max_steps") is not None:
        conv.put("train.max_steps", num(conv.get("max_steps"), int, "max_steps"), "max_steps")


def _hyperparameters(conv: Conversion) -> None:
    """The keys that keep their name under `train.` (learning rate, warmup, Adam betas, seed, logging, eval)."""
    for src, dst, cast in (("learning_rate", "learning_rate", float), ("weight_decay", "weight_decay", float),
                           ("warmup_steps", "warmup_steps", int), ("warmup_ratio", "warmup_ratio", float),
                           ("adam_beta1", "adam_beta1", float), ("adam_beta2", "adam_beta2", float),
                           ("max_grad_norm", "max_grad_norm", float), ("seed", "seed", int),
                           ("logging_steps", "logging_steps", int), ("eval_steps", "eval_steps", int),
                           ("load_best_model_at_end", "load_best_model_at_end", bool),
                           ("metric_for_best_model", "metric_for_best_model", str)):
        value = conv.get(src)
        if value is not None:
            if src == "eval_steps" and isinstance(value, float) and value < 1:
                conv.note(src, f"{value} is a share of the run; recipeforge takes a step count (train.eval_steps "
                               f"left unset: evaluation at the end of each epoch)")
                continue
            conv.put(f"train.{dst}", num(value, cast, src) if cast in (int, float) else cast(value), src)
    if conv.get("max_grad_norm") == 0:
        conv.put("train.max_grad_norm", None, "max_grad_norm")


def _optimizer(conv: Conversion) -> None:
    """`optimizer` by its recipeforge name, or reported."""
    opt = conv.get("optimizer")
    if opt is not None:
        if opt in OPTIMIZERS:
            conv.put("train.optimizer", OPTIMIZERS[opt], "optimizer")
        else:
            conv.note("optimizer", f"'{opt}' has no counterpart; the recipe uses adamw")


def _scheduler(conv: Conversion) -> None:
    """`lr_scheduler` by its recipeforge name, or reported; its tuning keys are reported."""
    sched = conv.get("lr_scheduler")
    if sched is not None:
        if sched in SCHEDULERS:
            conv.put("train.scheduler", SCHEDULERS[sched], "lr_scheduler")
        else:
            conv.note("lr_scheduler", f"'{sched}' has no counterpart; the recipe uses cosine")
    for src in ("cosine_min_lr_ratio", "cosine_constant_lr_ratio", "lr_scheduler_kwargs", "lr_quadratic_warmup"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; train.scheduler decays as its name says (cosine_with_min_lr keeps "
                           "transformers' default floor)")


def _checkpointing(conv: Conversion) -> None:
    """`gradient_checkpointing` and `activation_offloading` (to pinned host memory; disk is reported)."""
    gc = conv.get("gradient_checkpointing")
    if gc is not None:
        conv.put("train.gradient_checkpointing", bool(gc), "gradient_checkpointing")
        if gc == "offload":  # Axolotl's older spelling of activation_offloading
            conv.put("train.activation_offloading", True, "gradient_checkpointing")
        elif isinstance(gc, str):
            conv.note("gradient_checkpointing", f"'{gc}' (offload to disk) has no counterpart; gradient "
                                                f"checkpointing is on, without offloading")
    offload = conv.get("activation_offloading")
    if offload == "disk":
        conv.note("activation_offloading", "offloading to disk has no counterpart; train.activation_offloading "
                                           "keeps them in pinned host memory")
        conv.put("train.activation_offloading", True, "activation_offloading")
    elif offload is not None:  # true, or "legacy" (its older hooks): TRL's offloading either way
        conv.put("train.activation_offloading", bool(offload), "activation_offloading")
    if conv.get("gradient_checkpointing_kwargs") is not None:
        conv.note("gradient_checkpointing_kwargs", "no counterpart; recipeforge checkpoints without reentrant")


def _eval_save_notes(conv: Conversion) -> None:
    """Per-epoch counts and strategies of evaluation and saving: reported (recipeforge counts steps or epochs)."""
    for src in ("evals_per_epoch", "saves_per_epoch"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; without eval_steps/save_steps recipeforge evaluates and saves at the "
                           "end of each epoch")
    for src in ("eval_strategy", "save_strategy", "evaluation_strategy"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; steps when train.eval_steps / output.save_steps are set, else epochs")


def loss_watchdog(conv: Conversion) -> None:
    """Axolotl's loss watchdog (stop after `patience` logged losses above an absolute threshold) as
    train.divergence, which stops after `spike_patience` losses above `spike_factor` times the running
    median: the threshold becomes a factor of the loss at the start, as Axolotl's docs size it."""
    threshold, patience = conv.get("loss_watchdog_threshold"), conv.get("loss_watchdog_patience")
    if threshold is None:
        if patience is not None:
            conv.note("loss_watchdog_patience", "ignored without loss_watchdog_threshold (as Axolotl does)")
        return
    threshold = num(threshold, float, "loss_watchdog_threshold")
    conv.put("train.divergence.on_spike", "stop", "loss_watchdog_threshold")
    conv.put("train.divergence.spike_factor", 2.0, "loss_watchdog_threshold")
    conv.note("loss_watchdog_threshold", f"an absolute loss ({threshold:g}) in Axolotl; train.divergence stops on "
                                         "a loss above spike_factor 2.0 x the running median (Axolotl's advice: "
                                         "about 2 x the starting loss), and on any NaN loss")
    if patience is not None:
        conv.put("train.divergence.spike_patience", num(patience, int, "loss_watchdog_patience"),
                 "loss_watchdog_patience")


def unfrozen(conv: Conversion) -> None:
    """`unfrozen_parameters` (same pattern semantics) for a full fine-tune; next to an adapter it is
    reported, since recipeforge refuses it there (peft would not save the base weights it trains)."""
    patterns = conv.get("unfrozen_parameters")
    if patterns is None:
        return
    patterns = [patterns] if isinstance(patterns, str) else patterns
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        conv.note("unfrozen_parameters", "not a list of name patterns; not converted (every parameter trains)")
    elif conv.get("adapter") is not None:
        conv.note("unfrozen_parameters", "not converted next to an adapter: the adapter freezes the base model "
                                         "and saves only itself (list whole modules under adapter.modules_to_save "
                                         "to train them too" + ("; model.vision.train_tower / train_projector put "
                                                                "adapters on the vision tower / projector)"
                                                                if conv.vision else ")"))
    else:
        conv.put("train.unfrozen_parameters", list(patterns), "unfrozen_parameters")


def logging_output(conv: Conversion) -> None:
    if conv.get("output_dir") is not None:
        conv.put("output.dir", str(conv.get("output_dir")), "output_dir")
    for src, dst in (("save_steps", "save_steps"), ("save_total_limit", "save_total_limit")):
        value = conv.get(src)
        if value is not None:
            if isinstance(value, float) and value < 1:
                conv.note(src, f"{value} is a share of the run; recipeforge takes a step count (saves each epoch)")
                continue
            conv.put(f"output.{dst}", num(value, int, src), src)
    if conv.get("resume_from_checkpoint") is not None:
        conv.put("output.resume", str(conv.get("resume_from_checkpoint")), "resume_from_checkpoint")
    if conv.get("auto_resume_from_checkpoints") is not None:
        conv.map("auto_resume_from_checkpoints", "output.resume")
        if "resume_from_checkpoint" not in conv.mapped:
            conv.put("output.resume", "auto" if conv.get("auto_resume_from_checkpoints") else "never")
    if conv.get("hub_model_id") is not None:
        conv.put("output.push_to_hub", {"repo_id": str(conv.get("hub_model_id")), "private": True}, "hub_model_id")
        conv.note("hub_model_id", "the repository is created private (output.push_to_hub.private: true); set it "
                                  "false to publish")
    if conv.get("hub_strategy") is not None:
        conv.note("hub_strategy", "no counterpart; final/ is uploaded once after training")
    project = conv.get("wandb_project")
    if project:
        wandb = {"project": str(project)}
        for src, dst in (("wandb_entity", "entity"), ("wandb_name", "name"), ("wandb_mode", "mode")):
            if conv.get(src) is not None:
                wandb[dst] = str(conv.get(src))
                conv.map(src, f"logging.wandb.{dst}")
        if wandb.get("mode") not in (None, "online", "offline", "disabled"):
            conv.note("wandb_mode", f"'{wandb.pop('mode')}' has no counterpart; online")
        conv.put("logging.wandb", wandb, "wandb_project")
    for src in ("wandb_watch", "wandb_log_model", "wandb_run_id"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; recipeforge logs metrics only")
    if conv.get("use_tensorboard") is not None:
        conv.put("logging.tensorboard", bool(conv.get("use_tensorboard")), "use_tensorboard")
    if conv.get("use_mlflow") or conv.get("mlflow_tracking_uri"):
        mlflow = {}
        if conv.get("mlflow_tracking_uri"):
            mlflow["tracking_uri"] = str(conv.get("mlflow_tracking_uri"))
            conv.map("mlflow_tracking_uri", "logging.mlflow.tracking_uri")
        if conv.get("mlflow_experiment_name"):
            mlflow["experiment"] = str(conv.get("mlflow_experiment_name"))
            conv.map("mlflow_experiment_name", "logging.mlflow.experiment")
        conv.put("logging.mlflow", mlflow, "use_mlflow" if conv.get("use_mlflow") is not None else None)
    if conv.get("strict") is not None:
        conv.note("strict", "not needed: recipeforge always refuses unknown keys")

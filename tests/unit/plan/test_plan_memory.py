"""The per-GPU memory model: component behaviour, and activations against what autograd really saves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recipeforge.plan.catalog import KNOWN_CONFIGS
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import (activation_bytes, estimate, layer_activation_bytes_per_token,
                                     logits_bytes, quantized_bytes_per_param)
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.workload import Rollout, Workload, lora_targets
from recipeforge.plan.planners import Planners
from plan_testing import bound_layout

LLAMA8B = spec_from_config(KNOWN_CONFIGS["meta-llama/Llama-3.1-8B"], "meta-llama/Llama-3.1-8B")
SINGLE = bound_layout("single", None)
H100 = 79.6 * GIB


def workload(**kw) -> Workload:
    base = dict(model=LLAMA8B, stage="sft", dtype="bf16", adapter="none", optimizer="adamw", attention="fused",
                seq_len=2048, logit_tokens=2048)
    base.update(kw)
    return Workload(**base)


def lora(**kw) -> Workload:
    return workload(adapter="lora", lora_rank=16, lora_linears=lora_targets(LLAMA8B, "all-linear"), **kw)


def test_full_finetune_single_gpu_states():
    mem = estimate(workload(), SINGLE, 1, True, gpu_memory=H100)
    psi = LLAMA8B.total_params()
    # bf16 weights and gradients, AdamW moments in the parameter dtype
    assert mem.components["weights"] == 2 * psi and mem.components["gradients"] == 2 * psi
    assert mem.components["optimizer"] == 4 * psi
    assert mem.components["runtime"] > 0 and mem.total > 8 * psi


def test_eight_bit_optimizer_is_smaller():
    full = estimate(workload(), SINGLE, 1, True).components["optimizer"]
    small = estimate(workload(optimizer="adamw_8bit"), SINGLE, 1, True).components["optimizer"]
    assert small == pytest.approx(full / 2, rel=0.01)  # 2 bytes instead of 2 x bf16


def test_qlora_weights_are_about_half_a_byte():
    assert quantized_bytes_per_param(4, True, 4096) == pytest.approx(0.5 + 0.127 / 8, rel=0.01)
    assert quantized_bytes_per_param(4, False, 4096) == pytest.approx(0.5 + 0.5 / 8, rel=0.01)
    q = estimate(replace(lora(), adapter="qlora"), SINGLE, 1, True).components["weights"]
    linear = LLAMA8B.linear_params()
    # decoder linears in NF4; embeddings, head and norms in fp32 (peft's k-bit preparation upcasts them)
    assert q == pytest.approx(linear * quantized_bytes_per_param(4, True, 4096) + (LLAMA8B.total_params() - linear) * 4)
    assert estimate(lora(), SINGLE, 1, True).components["weights"] == 2 * LLAMA8B.total_params()
    assert estimate(lora(), SINGLE, 1, True).components["gradients"] == 0


def test_lora_adapter_size():
    w = lora()
    per_layer = 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 3)
    assert w.lora_params() == 32 * per_layer
    assert estimate(w, SINGLE, 1, True).components["adapter"] == pytest.approx(16 * w.lora_params())


def test_checkpointing_and_attention_and_sequence_length():
    base = estimate(workload(), SINGLE, 1, False).components["activations"]
    ckpt = estimate(workload(), SINGLE, 1, True).components["activations"]
    eager = estimate(workload(attention="eager"), SINGLE, 1, False).components["activations"]
    longer = estimate(workload(seq_len=4096, logit_tokens=4096), SINGLE, 1, False).components["activations"]
    assert ckpt < base / 10
    assert eager > base * 1.5                   # the s^2 attention scores
    assert longer == pytest.approx(2 * base, rel=0.01)
    assert estimate(workload(), SINGLE, 4, False).components["activations"] == pytest.approx(4 * base, rel=0.01)


def test_logits_and_fused_loss():
    # backward holds the saved fp32 log-softmax, its gradient and the input gradient: 12 bytes per entry
    assert logits_bytes(workload(), 2048) == 2048 * 12 * 128256
    assert logits_bytes(workload(fused_loss=True), 2048) < logits_bytes(workload(), 2048) / 10


def test_sharding_divides_states():
    w = workload()
    single = estimate(w, SINGLE, 1, True)
    fsdp = estimate(w, bound_layout("fsdp", "fsdp_full_shard", data_parallel=8, gpus_per_node=8), 1, True)
    assert fsdp.components["optimizer"] == pytest.approx(single.components["optimizer"] * 2 / 8)  # fp32 states
    assert fsdp.components["weights"] == pytest.approx(4 * LLAMA8B.total_params() / 8)
    ddp = estimate(w, bound_layout("ddp", None, data_parallel=8, gpus_per_node=8), 1, True)
    assert ddp.components["comm_buffers"] == ddp.components["gradients"]


def test_offload_moves_states_to_host():
    w = workload()
    on = estimate(w, bound_layout("deepspeed", "zero3", data_parallel=8, zero_stage=3, gpus_per_node=8), 1, True)
    off = estimate(w, bound_layout("deepspeed", "zero3_offload_params", data_parallel=8, zero_stage=3,
                             offload="optimizer+params", gpus_per_node=8), 1, True)
    assert off.components["optimizer"] == 0 and off.components["weights"] == 0
    assert off.total < on.total and off.cpu_per_node > 16 * LLAMA8B.total_params()


def test_megatron_distributed_optimizer():
    w = workload(stage="pretrain")
    layout = bound_layout("megatron", "tp8_pp1", data_parallel=2, tensor_parallel=8, gpus_per_node=8, nodes=2)
    mem = estimate(w, layout, 1, True)
    local = LLAMA8B.total_params() / 8
    # 6 + 12/d bytes per parameter (bf16 weights, fp32 main grads, fp32 master+Adam over d ranks)
    states = mem.components["weights"] + mem.components["gradients"] + mem.components["optimizer"]
    assert states == pytest.approx(local * (6 + 12 / 2))


def test_dpo_and_reference_model():
    sft = estimate(workload(), SINGLE, 1, True)
    dpo = estimate(workload(stage="dpo", sequences_per_sample=2, reference_model=True), SINGLE, 1, True)
    assert dpo.components["logits"] == 2 * sft.components["logits"]
    assert dpo.components["reference_model"] == 2 * LLAMA8B.total_params()


def test_grpo_rollout_memory():
    rollout = Rollout(engine="vllm", colocated=True, gpu_memory_utilization=0.3, prompt_len=512, completion_len=256,
                      reserves_memory=True)
    w = workload(stage="grpo", seq_len=768, logit_tokens=256, rollout=rollout)
    vllm = estimate(w, SINGLE, 1, True, gpu_memory=H100)
    assert vllm.components["rollout_engine"] == pytest.approx(0.3 * H100)
    hf = estimate(replace(w, rollout=replace(rollout, engine="hf")), SINGLE, 2, True, accumulation=4, gpu_memory=H100)
    # K and V, 32 layers, 8 x 128 KV width, bf16, for the 8 sequences TRL generates at once
    assert hf.components["kv_cache"] == 8 * 768 * 32 * 2 * 1024 * 2
    server = estimate(replace(w, rollout=replace(rollout, colocated=False)), SINGLE, 1, True, gpu_memory=H100)
    assert server.components["rollout_engine"] == 0 and server.components["kv_cache"] == 0
    # A colocated plugin engine that declares no reservation holds no vLLM share (and is noted as unsized).
    own = estimate(replace(w, rollout=replace(rollout, engine="mine", reserves_memory=False)), SINGLE, 1, True,
                   gpu_memory=H100)
    assert own.components["rollout_engine"] == 0
    assert "the memory of rollout engine mine is not estimated" in own.notes


def test_rollout_reservation_comes_from_the_engine(recipe, monkeypatch):
    from recipeforge.components.rollout import RolloutEngineSpec, rollout_engines
    from recipeforge.plan.workload import build_workload
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.hardware import parse_hardware

    spec, _ = resolve_model("Qwen/Qwen2.5-7B")
    hw = parse_hardware("1xH100-80GB")

    def reserves(engine: str) -> bool:
        r = recipe("Qwen/Qwen2.5-7B", "grpo", grpo={"rollout": {"engine": engine}})
        return build_workload(r, spec, hw, Planners.installed()).rollout.reserves_memory

    assert reserves("hf") is False
    assert reserves("vllm") is True  # sized like vLLM even where its plugin is not installed
    # A plugin engine that holds no share of the GPU (registered for this test only).
    monkeypatch.setattr(rollout_engines, "_entries", dict(rollout_engines._entries))
    monkeypatch.setattr(rollout_engines, "_raw", dict(rollout_engines._raw))
    rollout_engines.register("quiet_engine", RolloutEngineSpec("quiet_engine", lambda r, o, d: {}))
    assert reserves("quiet_engine") is False


def test_liger_options_decide_what_is_fused(recipe):
    from recipeforge.plan.workload import build_workload
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.hardware import parse_hardware

    spec, _ = resolve_model("meta-llama/Llama-3.1-8B")
    hw = parse_hardware("1xH100-80GB")

    def fused(kernels):
        w = build_workload(recipe("meta-llama/Llama-3.1-8B", kernels=kernels), spec, hw, Planners.installed())
        return w.fused_loss, w.fused_kernels

    assert fused({}) == (False, False)
    assert fused({"liger": {}}) == (True, True)
    assert fused({"liger": {"fused_linear_cross_entropy": False}}) == (False, True)
    assert fused({"liger": {"cross_entropy": True}}) == (False, True)
    assert fused({"liger": {"rms_norm": False, "swiglu": False}}) == (True, False)


def test_peak_takes_the_larger_phase():
    mem = estimate(workload(), SINGLE, 1, True)
    c = mem.components
    # the Trainer's gradients exist from backward to zero_grad(set_to_none=True): with one micro batch
    # per step they meet the optimizer step, not a full set of activations
    persistent = sum(c[k] for k in ("weights", "optimizer", "adapter", "reference_model",
                                    "comm_buffers", "rollout_engine", "runtime"))
    train = c["activations"] + c["logits"] + c["gathered_params"] + c["output_gradient"] + c["autocast_weights"]
    step = c["gradients"] + c["optimizer_step"]
    assert mem.train_peak == "the loss's backward"
    assert mem.total == pytest.approx(persistent + max(train, step, c["kv_cache"]) + c["allocator_reserve"])
    # the optimizer step is the larger phase here: it reuses the train phase's freed blocks
    assert step > train and c["allocator_reserve"] == 0


def test_the_allocator_reserve_is_the_loss_s_idle_blocks():
    from recipeforge.plan.activations import activation_split

    # recomputation: one layer's forward working tensors and the 16-bit logits block the upcast frees
    # are cached but each too small for the loss's 4-byte requests
    w, tokens = lora(), 2048
    act = activation_split(w, tokens, layers=32, checkpointing=True)
    ckpt = estimate(w, SINGLE, 1, True).components
    assert ckpt["allocator_reserve"] == pytest.approx(act.recomputed + 2 * 128256 * tokens)
    # twice the tokens, twice the idle blocks: they scale with the micro batch, not with the states
    assert estimate(w, SINGLE, 2, True).components["allocator_reserve"] == pytest.approx(2 * ckpt["allocator_reserve"])
    # without recomputation: one layer's backward working tensors of the step before
    plain = estimate(w, SINGLE, 1, False).components
    act = activation_split(w, tokens, layers=32, checkpointing=False)
    assert plain["allocator_reserve"] == pytest.approx(act.working + act.mlp_backward + 2 * 128256 * tokens)
    # a fused loss makes no vocabulary-wide 16-bit logits to leave behind
    fused = estimate(replace(w, fused_loss=True), SINGLE, 1, False).components
    assert fused["allocator_reserve"] < plain["allocator_reserve"] - 128256 * tokens


def test_the_train_phase_is_its_largest_moment_not_the_sum_of_its_peaks():
    from recipeforge.plan.activations import activation_split, logits_phases
    from recipeforge.plan.memory import output_gradient_bytes

    w, tokens = workload(), 2048
    act = activation_split(w, tokens, layers=32, checkpointing=True)
    c = estimate(w, SINGLE, 1, True).components
    # the loss's backward holds the 12-byte log-softmax gradients and the layer inputs; the layer
    # recomputed later and the output layer's gradient come after the logits are freed
    assert c["logits"] == logits_phases(w, tokens)[1] == 12 * 128256 * tokens
    assert c["activations"] == pytest.approx(act.stored + act.outside) and c["output_gradient"] == 0
    assert output_gradient_bytes(w, SINGLE, False) == 2 * 128256 * 4096
    # with a small vocabulary the recomputed layer is the peak, and the logits are gone by then
    small = estimate(replace(w, model=replace(LLAMA8B, vocab_size=1024)), SINGLE, 1, True)
    assert small.train_peak.startswith("the last layer's backward") and small.components["logits"] == 0
    assert small.components["activations"] > act.stored + act.recomputed


def test_autocast_copies_of_recomputed_layers_die_with_the_forward():
    mixed = replace(workload(), fp32_master=True)
    plain = estimate(mixed, SINGLE, 1, False)
    ckpt = estimate(mixed, SINGLE, 1, True)
    head = 2 * 128256 * 4096
    # every 16-bit copy is alive when the forward ends; backward keeps only what its matmuls saved
    assert plain.components["autocast_weights"] == pytest.approx(2 * LLAMA8B.linear_params() + head)
    assert ckpt.train_peak == "the end of the forward pass (the loss)"
    assert ckpt.components["autocast_weights"] == plain.components["autocast_weights"]
    assert ckpt.components["logits"] == 10 * 128256 * 2048  # bf16 logits, their fp32 copy, the log-softmax


def test_fp32_weights_keep_an_fp32_residual_stream():
    from recipeforge.plan.activations import layer_activation_parts

    w = workload()
    bf16, fp32 = layer_activation_parts(w)["norms"], layer_activation_parts(w, fp32_weights=True)["norms"]
    # fp32 input and normalised tensor per norm, and a 16-bit cast for each of q, k, v, gate and up
    assert fp32 - bf16 == 2 * (4 * 4096 - 2 * 2 * 4096) + 5 * 2 * 4096


def test_sdpa_over_packed_rows_keeps_a_mask_and_repeated_heads():
    from recipeforge.plan.activations import layer_activation_parts

    masked = layer_activation_parts(workload(attention_mask=True))["attention"]
    fused = layer_activation_parts(workload())["attention"]
    assert masked - fused == 2 * 2 * (4096 - 1024) + 2 * 2048  # k and v to all 32 heads, the mask row


def test_fsdp2_holds_more_unsharded_at_a_layers_backward_than_at_the_loss():
    from recipeforge.backends.fsdp_memory import fsdp_gathered

    layout = bound_layout("fsdp", "fsdp_full_shard", data_parallel=8, gpus_per_node=8)
    g = fsdp_gathered(workload(), layout)
    root = 2 * LLAMA8B.total_params() - 2 * 32 * LLAMA8B.layer_params()
    layer = 2 * LLAMA8B.layer_params()
    assert g.backward == pytest.approx(root + layer)            # the root, the last layer prefetched
    assert g.layer == pytest.approx(root + 2 * layer)           # + the next layer's prefetch
    assert g.layer_later == pytest.approx(root + 3 * layer)     # + the previous layer's reduce-scatter input
    assert g.layer_gradients == pytest.approx(layer) and g.output_gradient == 2 * 128256 * 4096
    # two layers: the first of backward has the prefetch, the second the reduce-scatter input only
    two = fsdp_gathered(workload(model=replace(LLAMA8B, num_layers=2)), layout)
    assert two.layer == pytest.approx(two.layer_later) == pytest.approx(two.backward + layer)


def test_gradients_meet_the_activations_from_the_second_micro_batch():
    one = estimate(workload(), SINGLE, 4, False)  # forward/backward is the larger phase
    two = estimate(workload(), SINGLE, 4, False, accumulation=2)
    c = one.components
    assert c["activations"] + c["logits"] > c["gradients"] + c["optimizer_step"]
    reserve = two.components["allocator_reserve"] - c["allocator_reserve"]
    assert two.total - one.total == pytest.approx(c["gradients"] - c["output_gradient"] + reserve)
    # DeepSpeed keeps its gradient partitions for the whole step, as its estimators count them
    zero2 = bound_layout("deepspeed", "zero2", data_parallel=8, zero_stage=2, gpus_per_node=8)
    assert estimate(workload(), zero2, 1, False).total == estimate(workload(), zero2, 1, False, accumulation=2).total


def test_paged_optimizer_states_count_for_the_step_only():
    paged = estimate(workload(optimizer="paged_adamw_8bit"), SINGLE, 4, False)
    resident = estimate(workload(optimizer="adamw_8bit"), SINGLE, 4, False)
    assert paged.components["optimizer"] == 0
    assert paged.components["paged_optimizer"] == resident.components["optimizer"]
    assert paged.total < resident.total and any("paged" in n for n in paged.notes)


# ----------------------------------------------------------------------------- against autograd

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Dimensions chosen so that no activation has the shape of a weight (the hook filters weights by shape).
TINY = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
BATCH, SEQ = 3, 96


def saved_activation_bytes(attn: str, use_lora: bool, checkpointing: bool, trained: str | None = None) -> int:
    """Bytes autograd keeps for backward while the decoder layers run forward (weights excluded).
    `trained`: only the parameters whose names contain it train (a partial full fine-tune)."""
    config = transformers.AutoConfig.for_model("llama", **{k: v for k, v in TINY.items() if k != "model_type"})
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    if use_lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0))
    model.train()
    if trained is not None:
        for name, param in model.named_parameters():
            param.requires_grad_(trained in name)
    inner = model.base_model.model.model if use_lora else model.model
    if checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if tuple(t.shape) not in shapes:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ))
    pos = torch.arange(SEQ)[None].expand(BATCH, -1)
    # autocast as the Trainer runs it (LoRA adapters are fp32 and see bf16 inputs through it)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_lora):
        hidden = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        rope = inner.rotary_emb(hidden, pos)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for layer in inner.layers:
                out = layer(hidden, position_embeddings=rope, attention_mask=None, position_ids=pos)
                hidden = out[0] if isinstance(out, tuple) else out
    return sum(seen.values())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("use_lora", [False, True])
def test_layer_activations_match_autograd(attn, use_lora):
    spec = spec_from_config(TINY)
    w = Workload(model=spec, stage="sft", dtype="bf16", adapter="lora" if use_lora else "none", optimizer="adamw",
                 attention="fused" if attn == "sdpa" else "eager", seq_len=SEQ, logit_tokens=SEQ, lora_rank=8,
                 lora_linears=lora_targets(spec, "all-linear") if use_lora else (), lora_dropout=0.0)
    predicted = BATCH * SEQ * spec.num_layers * layer_activation_bytes_per_token(w)
    measured = saved_activation_bytes(attn, use_lora, checkpointing=False)
    assert predicted == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("trained, kinds", [("norm", {"norm"}), ("proj", {"linear"})])
def test_a_partial_fine_tune_keeps_what_its_trained_weights_need(attn, trained, kinds):
    """train.unfrozen_parameters: frozen linears keep no inputs for weight gradients, frozen norms no
    normalised tensor; the planned layer activations follow what autograd really keeps."""
    spec = spec_from_config(TINY)
    w = Workload(model=spec, stage="sft", dtype="bf16", adapter="none", optimizer="adamw",
                 attention="fused" if attn == "sdpa" else "eager", seq_len=SEQ, logit_tokens=SEQ,
                 unfrozen_params=1, unfrozen_kinds=frozenset(kinds))
    predicted = BATCH * SEQ * spec.num_layers * layer_activation_bytes_per_token(w)
    measured = saved_activation_bytes(attn, False, checkpointing=False, trained=trained)
    assert predicted == pytest.approx(measured, rel=0.10)
    whole = Workload(model=spec, stage="sft", dtype="bf16", adapter="none", optimizer="adamw",
                     attention=w.attention, seq_len=SEQ, logit_tokens=SEQ)
    assert layer_activation_bytes_per_token(w) < layer_activation_bytes_per_token(whole)


def test_checkpointed_layers_keep_their_inputs():
    spec = spec_from_config(TINY)
    w = Workload(model=spec, stage="sft", dtype="bf16", adapter="none", optimizer="adamw", attention="fused",
                 seq_len=SEQ, logit_tokens=SEQ)
    measured = saved_activation_bytes("sdpa", False, checkpointing=True)
    # forward keeps each layer's input; the recomputed layer is added by the model during backward
    stored = activation_bytes(w, BATCH * SEQ, layers=spec.num_layers, checkpointing=True) \
        - BATCH * SEQ * layer_activation_bytes_per_token(w) \
        - BATCH * SEQ * (4 * spec.hidden_size + 2 * 2 * spec.hidden_size)
    assert stored == pytest.approx(measured, rel=0.10)

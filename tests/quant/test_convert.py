"""convert_to_quantized_training swaps a model's nn.Linear layers for quant.Linear in place.

Which layers are swapped (filter by name, nested containers, a root Linear), that the
swapped layers keep the very Parameter objects (an optimizer built before converting
still trains them), their dtype and device, and compute bit for bit what a quant.Linear
built directly computes. Each eligibility rule of unsupported_reason is checked against
what it stands for: the quantized Linear failing on such a layer (here, or on CUDA for
torch._scaled_mm), or TransformerEngine's stated requirement; a refusal names the layer
and leaves the model unchanged, "skip" warns once.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.utils.parametrize
from torch import nn

from tetrt_support.quant import Linear, convert_to_quantized_training, get_recipe, unsupported_reason
from tetrt_support.quant.recipes import RECIPES

D = 32  # a multiple of every recipe's blocks


class Block(nn.Module):
    def __init__(self, d: int = D, up: int = 2 * D) -> None:
        super().__init__()
        self.attn = nn.ModuleDict({"qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d, bias=False)})
        self.mlp = nn.ModuleDict({"up": nn.Linear(d, up), "act": nn.GELU(), "down": nn.Linear(up, d)})
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn["qkv"](self.norm(x)).chunk(3, dim=-1)
        x = x + self.attn["proj"](torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
        return x + self.mlp["down"](self.mlp["act"](self.mlp["up"](x)))


class Model(nn.Module):
    def __init__(self, vocab: int = 64, *, up: int = 2 * D) -> None:
        super().__init__()
        self.layers = nn.Sequential(Block(up=up), Block())
        self.lm_head = nn.Linear(D, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.layers(x))


INNER = [f"layers.{i}.{name}" for i in range(2) for name in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")]


def not_lm_head(module: nn.Module, fqn: str) -> bool:
    return fqn != "lm_head"


def _modules(model: nn.Module) -> dict[str, nn.Module]:
    return dict(model.named_modules())


# ------------------------------------------------------------------ what is swapped
def test_swaps_the_linears_the_filter_passes_and_nothing_else() -> None:
    model = Model()
    before = _modules(model)
    seen: list[tuple[type, str]] = []

    def record(module: nn.Module, fqn: str) -> bool:
        seen.append((type(module), fqn))
        return not_lm_head(module, fqn)

    assert convert_to_quantized_training(model, module_filter_fn=record) is model
    after = _modules(model)
    assert sorted(seen) == sorted([(nn.Linear, fqn) for fqn in [*INNER, "lm_head"]])  # asked about every Linear
    for fqn in INNER:
        assert type(after[fqn]) is Linear and after[fqn].recipe == get_recipe("fp8_current")
    assert after["lm_head"] is before["lm_head"] and type(after["lm_head"]) is nn.Linear
    unswapped = [fqn for fqn in before if fqn not in INNER]
    assert all(after[fqn] is before[fqn] for fqn in unswapped)  # containers, norms, activations, lm_head
    assert "(qkv): Linear(in_features=32, out_features=96, bias=True, recipe='fp8_current'" in repr(model)


def test_no_filter_swaps_every_linear_with_one_recipe() -> None:
    model = convert_to_quantized_training(Model(), "mxfp8")
    linears = {fqn: m for fqn, m in model.named_modules() if isinstance(m, (nn.Linear, Linear))}
    assert sorted(linears) == sorted([*INNER, "lm_head"])
    assert all(type(m) is Linear and m.recipe == get_recipe("mxfp8") for m in linears.values())


def test_subclasses_are_swapped_as_torchao_does() -> None:
    class Tagged(nn.Linear):
        pass

    model = nn.Sequential(Tagged(D, D))
    assert type(convert_to_quantized_training(model)[0]) is Linear


def test_a_layer_under_two_names_becomes_one_quantized_layer() -> None:
    shared = nn.Linear(D, D)
    model = nn.ModuleDict({"a": shared, "b": nn.Sequential(shared)})
    convert_to_quantized_training(model)
    assert type(model["a"]) is Linear and model["b"][0] is model["a"]
    assert model["a"].weight is shared.weight


def test_a_root_linear_is_returned_converted() -> None:
    root = nn.Linear(D, 2 * D)
    new = convert_to_quantized_training(root, "fp8_block")
    assert type(new) is Linear and new.recipe == get_recipe("fp8_block")
    assert new.weight is root.weight and new.bias is root.bias
    assert type(root) is nn.Linear  # the root itself cannot be swapped in place
    assert convert_to_quantized_training(root, module_filter_fn=lambda m, fqn: False) is root


def test_converting_twice_changes_nothing_more() -> None:
    model = convert_to_quantized_training(Model())
    before = _modules(model)
    convert_to_quantized_training(model, "mxfp8")  # quant.Linear is no nn.Linear
    assert _modules(model) == before


# ------------------------------------------------------------- parameters, device, dtype
def test_parameters_are_the_same_objects_with_the_same_data() -> None:
    model = Model()
    model.layers[1].attn["qkv"].weight.requires_grad_(False)
    old = {fqn: (m.weight, m.bias) for fqn, m in _modules(model).items() if fqn in INNER}
    values = {name: p.detach().clone() for name, p in model.named_parameters()}
    convert_to_quantized_training(model, module_filter_fn=not_lm_head)
    for fqn, (weight, bias) in old.items():
        new = model.get_submodule(fqn)
        assert new.weight is weight and new.bias is bias
    assert model.get_submodule("layers.0.attn.proj").bias is None
    assert not model.layers[1].attn["qkv"].weight.requires_grad
    assert model.layers[0].attn["qkv"].weight.requires_grad
    after = dict(model.named_parameters())
    assert sorted(after) == sorted(values)  # same names: a state dict saved before still loads
    assert all(torch.equal(after[name], value) for name, value in values.items())


def test_an_optimizer_built_before_conversion_trains_the_new_layers() -> None:
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    convert_to_quantized_training(model)
    model(torch.randn(2, 32, D)).square().mean().backward()
    optimizer.step()
    for fqn in INNER:
        layer = model.get_submodule(fqn)
        assert type(layer) is Linear and layer.weight.grad is not None
        assert not torch.equal(layer.weight.detach(), before[f"{fqn}.weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_dtype_and_mode_are_kept(dtype: torch.dtype) -> None:
    model = Model().to(dtype).eval()
    convert_to_quantized_training(model)
    for fqn in INNER:
        layer = model.get_submodule(fqn)
        assert layer.weight.dtype == dtype and layer.weight.device.type == "cpu" and not layer.training
        assert all(t.dtype == dtype for t in [layer.weight, *([layer.bias] if layer.bias is not None else [])])
    assert model(torch.randn(2, 32, D, dtype=dtype)).dtype == dtype
    x = torch.randn(32, D, dtype=dtype)  # the cached weight is rebuilt from the templates made for this dtype
    head = model.lm_head
    assert torch.equal(head(x, is_first_microbatch=True), head(x, is_first_microbatch=False))


def test_a_meta_model_stays_on_meta() -> None:
    with torch.device("meta"):
        model = Model()
    convert_to_quantized_training(model)
    assert all(p.device.type == "meta" for p in model.parameters())
    model.to_empty(device="cpu")  # the weight templates follow the real device
    assert model.layers[0].attn["qkv"].weight.device.type == "cpu"


# -------------------------------------------------------------------- the same numbers
CONVERTIBLE = [("fp8_current", torch.float32), ("fp8_block", torch.float32), ("mxfp8", torch.float32),
               ("nvfp4", torch.bfloat16), (get_recipe("nvfp4", rht_any_input_dtype=True), torch.float32)]


@pytest.mark.parametrize(("recipe", "dtype"), CONVERTIBLE, ids=lambda v: str(v))
def test_forward_and_backward_equal_a_linear_built_directly(recipe, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D, bias=False)).to(dtype)
    direct = nn.Sequential(Linear(D, 2 * D, recipe=recipe, dtype=dtype), nn.ReLU(),
                           Linear(2 * D, D, bias=False, recipe=recipe, dtype=dtype))
    direct.load_state_dict(plain.state_dict())
    converted = convert_to_quantized_training(plain, recipe)
    x = torch.randn(32, D, dtype=dtype)
    results = []
    for model in (direct, converted):
        torch.manual_seed(1)  # nvfp4's stochastic rounding draws from the default generator
        xi = x.clone().requires_grad_(True)
        out = model(xi)
        out.backward(torch.randn_like(out))
        results.append([out, xi.grad, *(p.grad for p in model.parameters())])
    assert len(results[0]) == len(results[1]) == 2 + 3
    for expected, actual in zip(*results):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)


# ----------------------------------------------------------------- the rules are real
def _runs(recipe, in_features: int, out_features: int, dtype: torch.dtype) -> bool:
    """Whether a quant.Linear of this shape and dtype builds and trains one step here (CPU)."""
    try:
        layer = Linear(in_features, out_features, recipe=recipe, dtype=dtype)
        layer(torch.randn(32, in_features, dtype=dtype, requires_grad=True)).sum().backward()
    except (ValueError, TypeError):
        return False
    return True


SHAPES = [(64, 64), (32, 48), (48, 32), (16, 64), (64, 16), (100, 64), (64, 100), (24, 64), (64, 24)]
BLOCK_RECIPES = ["mxfp8", "nvfp4", get_recipe("nvfp4", rht_any_input_dtype=True), get_recipe("nvfp4", disable_rht=True)]


@pytest.mark.parametrize("recipe", BLOCK_RECIPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_block_and_dtype_rules_are_what_the_linear_refuses(recipe, dtype: torch.dtype) -> None:
    """For the block-scaled recipes every rule is the quantized Linear's own failure: 1x32 /
    1x16 blocks along both features, the quantizers' dtypes, bf16 for the Hadamard transform
    (TE's other rule, in_features % 16 and out_features % 8, is weaker than the blocks)."""
    for in_features, out_features in SHAPES:
        reason = unsupported_reason(nn.Linear(in_features, out_features, dtype=dtype), recipe)
        assert (reason is None) == _runs(recipe, in_features, out_features, dtype), (in_features, out_features, reason)


@pytest.mark.parametrize("recipe", RECIPES)
def test_float64_is_refused_as_the_linear_refuses_it(recipe: str) -> None:
    assert not _runs(recipe, 64, 64, torch.float64)
    assert "dtype torch.float64 is not one of" in unsupported_reason(nn.Linear(64, 64, dtype=torch.float64), recipe)


def test_te_dims_rule_is_te_stated_and_the_only_fp8_block_rule() -> None:
    """fp8_block quantizes any shape here (partial edge blocks); the refusals are TE's Linear's
    assertion (``assert_dim_for_fp8_exec``: weight's last dim % 16, leading dims % 8)."""
    assert _runs("fp8_block", 24, 20, torch.float32)  # what the rule refuses, nothing else would
    assert unsupported_reason(nn.Linear(16, 8), "fp8_block") is None
    reason = unsupported_reason(nn.Linear(24, 20), "fp8_block")
    assert reason == (
        "in_features=24 is not a multiple of 16, which TransformerEngine's Linear asserts for every quantized recipe "
        "(assert_dim_for_fp8_exec); out_features=20 is not a multiple of 8, which TransformerEngine's Linear asserts "
        "for every quantized recipe (assert_dim_for_fp8_exec)"
    )


def test_fp8_current_needs_scaled_mm_alignment() -> None:
    assert unsupported_reason(nn.Linear(16, 16), "fp8_current") is None
    assert unsupported_reason(nn.Linear(16, 24), "fp8_current") == (
        "out_features=24 is not a multiple of 16, which torch._scaled_mm, fp8_current's FP8 GEMM, needs on CUDA"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_mm checks the alignment on CUDA only")
@pytest.mark.parametrize(("in_features", "out_features"), [(24, 64), (64, 24)])
def test_scaled_mm_refuses_the_fp8_current_layers_the_rule_refuses(in_features: int, out_features: int) -> None:
    layer = Linear(in_features, out_features, recipe="fp8_current", device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="divisible by 16"):
        layer(torch.randn(64, in_features, device="cuda", dtype=torch.bfloat16))
    assert Linear(64, 64, recipe="fp8_current", device="cuda", dtype=torch.bfloat16)(
        torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)).shape == (64, 64)


def test_a_layer_the_swap_would_damage_is_refused() -> None:
    class WithAdapter(nn.Linear):
        def __init__(self) -> None:
            super().__init__(D, D)
            self.adapter = nn.Linear(D, D)

    assert "has child modules (adapter), which replacing it" in unsupported_reason(WithAdapter())
    parametrized = nn.Linear(D, D)
    torch.nn.utils.parametrize.register_parametrization(parametrized, "weight", nn.Identity())
    assert "has child modules (parametrizations)" in unsupported_reason(parametrized)  # its weight is computed
    plain = nn.Linear(D, D)
    weight = plain.weight.detach().clone()
    del plain.weight
    plain.weight = weight  # a plain tensor: the quantized Linear can hold Parameters only
    with pytest.raises(TypeError, match="cannot assign"):
        Linear(D, D).weight = weight
    assert "its weight is a Tensor, not a torch.nn.Parameter" in unsupported_reason(plain)


# -------------------------------------------------------------- refusals and skipping
REFUSALS = [
    ("mxfp8", 100, D, torch.float32, "in_features=100 is not a multiple of 32, which mxfp8's 1x32 blocks need"),
    ("mxfp8", D, 48, torch.float32, "out_features=48 is not a multiple of 32, which mxfp8's 1x32 blocks need"),
    ("nvfp4", 24, D, torch.bfloat16, "in_features=24 is not a multiple of 16, which nvfp4's 1x16 blocks need"),
    ("nvfp4", D, D, torch.float32, "dtype torch.float32: nvfp4's Hadamard transform takes torch.bfloat16 input only"),
    ("fp8_current", D, 24, torch.float32, "out_features=24 is not a multiple of 16, which torch._scaled_mm"),
    ("fp8_block", 24, D, torch.float32, "in_features=24 is not a multiple of 16, which TransformerEngine's Linear"),
    ("fp8_block", D, 20, torch.float32, "out_features=20 is not a multiple of 8, which TransformerEngine's Linear"),
]


@pytest.mark.parametrize(("recipe", "in_features", "out_features", "dtype", "reason"), REFUSALS)
def test_a_refusal_names_the_layer_its_shape_and_the_reason(recipe, in_features, out_features, dtype, reason) -> None:
    model = nn.ModuleDict({"layers": nn.ModuleList([nn.ModuleDict({"mlp": nn.ModuleDict({
        "up": nn.Linear(in_features, out_features, dtype=dtype)})})])})
    assert unsupported_reason(model.layers[0].mlp.up, recipe).startswith(reason)
    with pytest.raises(ValueError) as info:
        convert_to_quantized_training(model, recipe)
    message = str(info.value)
    assert (f"layers.0.mlp.up (Linear, in_features={in_features}, out_features={out_features}, dtype={dtype}): "
            f"{reason}") in message
    assert "nothing was converted" in message


def test_a_refusal_checks_every_layer_first_and_leaves_the_model_unchanged() -> None:
    model = Model(up=48)  # layers.0.mlp.up and .down: 48 is no multiple of 32
    before = _modules(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"cannot quantize 2 layer\(s\)") as info:
        convert_to_quantized_training(model, "mxfp8")
    assert "layers.0.mlp.up (" in str(info.value) and "layers.0.mlp.down (" in str(info.value)
    assert _modules(model) == before
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_an_error_building_a_layer_leaves_the_model_unchanged() -> None:
    model = Model()
    before = _modules(model)
    with pytest.raises(ValueError, match="fake_impl"):
        convert_to_quantized_training(model, fake_impl="no_such_strategy")
    assert _modules(model) == before


def test_skip_leaves_the_refused_layers_and_warns_once() -> None:
    model = Model(up=48)
    up, down = model.layers[0].mlp["up"], model.layers[0].mlp["down"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert_to_quantized_training(model, "mxfp8", on_unsupported="skip")
    assert len(caught) == 1 and issubclass(caught[0].category, UserWarning)
    message = str(caught[0].message)
    assert "mxfp8 cannot quantize 2 layer(s), left as torch.nn.Linear" in message
    assert "layers.0.mlp.up (Linear, in_features=32, out_features=48, dtype=torch.float32): out_features=48" in message
    assert "layers.0.mlp.down (Linear, in_features=48, out_features=32" in message
    assert model.layers[0].mlp["up"] is up and model.layers[0].mlp["down"] is down
    converted = [fqn for fqn, m in model.named_modules() if type(m) is Linear]
    assert sorted(converted) == sorted([*(f for f in INNER if not f.startswith("layers.0.mlp")), "lm_head"])
    model(torch.randn(2, 32, D)).sum().backward()


def test_skip_without_refusals_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert_to_quantized_training(Model(), on_unsupported="skip")


# ------------------------------------------------------------------------ arguments
def test_linear_kwargs_reach_every_new_layer() -> None:
    model = convert_to_quantized_training(Model(), fake_impl="tensor_proto", compile_as="custom_ops")
    layers = [model.get_submodule(fqn) for fqn in [*INNER, "lm_head"]]
    assert all(layer.fake_impl == "tensor_proto" and layer.compile_as == "custom_ops" for layer in layers)


def test_bad_arguments_are_refused() -> None:
    model = Model()
    with pytest.raises(ValueError, match=r"on_unsupported must be one of \('raise', 'skip'\), got 'ignore'"):
        convert_to_quantized_training(model, on_unsupported="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="module_filter_fn must be a callable"):
        convert_to_quantized_training(model, module_filter_fn="lm_head")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype cannot be given"):
        convert_to_quantized_training(model, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        convert_to_quantized_training(torch.randn(2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown recipe"):
        convert_to_quantized_training(model, "fp4")
    with pytest.raises(TypeError, match="expected a torch.nn.Linear"):
        unsupported_reason(nn.Conv1d(1, 1, 1))
    assert all(type(m) is not Linear for m in model.modules())

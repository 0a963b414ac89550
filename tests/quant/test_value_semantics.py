"""Opt-in value identity: eq/hash/__fx_repr__, rebuild without __init__, the ProcessGroup guard."""

from __future__ import annotations

import ast
import pathlib
import warnings

import pytest
import torch

import tetrt_support.quant as quant
from tetrt_support.quant import (
    VALUE_QUANTIZERS,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
    is_value_opaque_quantizer,
    register_value_quantizer,
)
from tetrt_support.quant import dynamo, numerics
from tetrt_support.quant.distributed import single_process_group

VALUE_CASES = [
    Float8CurrentScalingQuantizer(),
    Float8CurrentScalingQuantizer(torch.float8_e5m2, force_pow_2_scales=True, columnwise_usage=True),
    Float8BlockQuantizer(block_scaling_dim=2, columnwise_usage=True),
    MXFP8Quantizer(columnwise_usage=True),
    NVFP4Quantizer(),
    NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x1234, columnwise_usage=True),
    NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_any_input_dtype=True),
    NVFP4Quantizer(with_2d_quantization=True, columnwise_usage=True),
    MXFP8Quantizer(torch.float8_e5m2, with_2d_quantization=True, columnwise_usage=True),
    Float8CurrentScalingQuantizer(amax_epsilon=float("inf")),
]


def _rebuild(q: Quantizer) -> Quantizer:
    expr, globals_ = q.__fx_repr__()
    return eval(expr, dict(globals_))  # only its own globals, as TE's test evaluates it


@pytest.mark.parametrize("q", VALUE_CASES, ids=repr)
def test_fx_repr_round_trip_quantizes_bit_exactly(q: Quantizer) -> None:
    rebuilt = _rebuild(q)
    assert type(rebuilt) is type(q) and rebuilt == q and hash(rebuilt) == hash(q) and rebuilt is not q
    x = (torch.randn(32, 64) * 3).bfloat16()  # bf16: every case takes it, NVFP4's transform only that
    a, b = q.quantize(x), rebuilt.quantize(x)
    for name, buf in a.inner_buffers().items():
        assert torch.equal(buf.view(torch.uint8), getattr(b, name).view(torch.uint8)), name  # bit-exact


def test_rebuild_bypasses_init_and_rebuilds_derived_state(monkeypatch: pytest.MonkeyPatch) -> None:
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x00FF)

    def no_init(self, *args, **kwargs):
        raise AssertionError("__init__ must not run when FX code rebuilds a quantizer")

    monkeypatch.setattr(NVFP4Quantizer, "__init__", no_init)
    rebuilt = _rebuild(q)
    assert torch.equal(rebuilt.rht_matrix, q.rht_matrix) and rebuilt.rht_matrix is not q.rht_matrix


def test_fx_repr_has_no_registry_and_no_derived_matrix() -> None:
    expr, globals_ = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True).__fx_repr__()
    assert NVFP4Quantizer in globals_.values()  # the class itself travels in the globals
    assert "rht_matrix" not in expr and "rht_sign_mask" in expr
    assert not any(isinstance(v, torch.Tensor) for v in globals_.values())


def test_equal_values_equal_hash_different_values_differ() -> None:
    assert MXFP8Quantizer() == MXFP8Quantizer() and hash(MXFP8Quantizer()) == hash(MXFP8Quantizer())
    assert MXFP8Quantizer() != MXFP8Quantizer(torch.float8_e5m2)
    assert MXFP8Quantizer() != MXFP8Quantizer(columnwise_usage=False)
    assert MXFP8Quantizer() != MXFP8Quantizer(optimize_for_gemm=True)
    assert NVFP4Quantizer(with_rht=True, with_post_rht_amax=True) != NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=1)
    rht = {"with_rht": True, "with_post_rht_amax": True}
    assert NVFP4Quantizer(**rht) != NVFP4Quantizer(**rht, rht_any_input_dtype=True)  # the dtype rule is part of the value
    assert NVFP4Quantizer(rht_any_input_dtype=True) == NVFP4Quantizer()  # without the transform it means nothing
    assert MXFP8Quantizer() != Float8BlockQuantizer()  # different classes never compare equal
    assert len({MXFP8Quantizer(), MXFP8Quantizer(), MXFP8Quantizer().copy()}) == 1


def test_derived_state_is_not_part_of_the_value() -> None:
    a, b = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True), NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    b._derived_rht_matrix = b._derived_rht_matrix * 0  # corrupt the derived matrix only
    assert a == b and hash(a) == hash(b)
    assert torch.equal(b.copy().rht_matrix, a.rht_matrix)  # copy() rebuilds it from the mask


def test_copy_is_equal_but_independent() -> None:
    q = MXFP8Quantizer()
    c = q.copy()
    c.set_usage(columnwise=False)
    assert q.columnwise_usage is True and c != q


def test_delayed_scaling_keeps_identity_semantics() -> None:
    a, b = Float8Quantizer(), Float8Quantizer()
    assert a != b and a == a and hash(a) != hash(b)
    with pytest.raises(TypeError, match="Float8Quantizer has identity semantics"):
        a._value_key()
    with pytest.raises(TypeError, match="field 'scale' is annotated <class 'torch.Tensor'>"):
        register_value_quantizer(Float8Quantizer)
    assert not is_value_opaque_quantizer(a)


def test_registered_value_quantizers_are_flagged() -> None:
    for cls in VALUE_QUANTIZERS:
        assert is_value_opaque_quantizer(cls()) and cls._tetrt_value_opaque is True
    assert quant.opaque_api_available()
    from torch._library import opaque_object

    # torch 2.14 calls value types "constant"; 2.11 - 2.13 spelled it is_opaque_value_type.
    is_opaque_constant_type = getattr(opaque_object, "is_opaque_constant_type", None) or opaque_object.is_opaque_value_type
    assert all(is_opaque_constant_type(cls) for cls in VALUE_QUANTIZERS)
    assert not is_opaque_constant_type(Float8Quantizer)


def test_held_process_group_raises_type_error_from_value_key() -> None:
    with single_process_group() as group:
        q = Float8CurrentScalingQuantizer(amax_reduction_group=group)
        for use in (lambda: q == Float8CurrentScalingQuantizer(), lambda: hash(q), q.__fx_repr__, q._value_key):
            with pytest.raises(TypeError, match="amax_reduction_group holds a torch.distributed.ProcessGroup"):
                use()
        other = MXFP8Quantizer()
        other.groups = (None, group)  # any field, nested too
        with pytest.raises(TypeError, match="MXFP8Quantizer.groups holds a torch.distributed.ProcessGroup"):
            hash(other)


def test_unsupported_value_field_type_is_named_at_registration() -> None:
    class WithListField(MXFP8Quantizer):
        sizes: list

    with pytest.raises(TypeError, match="field 'sizes' is annotated <class 'list'>"):
        register_value_quantizer(WithListField)


def test_registering_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="MXFP8Quantizer is already registered"):
        register_value_quantizer(MXFP8Quantizer)


def test_value_fields_are_the_annotations_declared_once() -> None:
    assert NVFP4Quantizer().__dict__.keys() >= set(NVFP4Quantizer._value_field_names)
    assert NVFP4Quantizer._value_field_names == (
        "rowwise_usage", "columnwise_usage", "internal", "with_rht", "with_post_rht_amax", "rht_sign_mask",
        "with_2d_quantization", "stochastic_rounding", "row_scaled_nvfp4", "nvfp4_use_4over6", "nvfp4_e4m3_max",
        "nvfp4_4over6_err_mode", "optimize_for_gemm", "rht_any_input_dtype", "nvfp4_4over6_err_use_fast_math",
    )


def test_subclass_of_a_value_quantizer_does_not_inherit_value_semantics() -> None:
    """A subclass is an identity quantizer until it registers itself: its own state could
    otherwise be ignored by __eq__ and a compiled graph reused for a different quantizer."""

    class Tagged(MXFP8Quantizer):
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

    a, b = Tagged("a"), Tagged("b")
    assert a != b and hash(a) != hash(b) and a == a
    assert not is_value_opaque_quantizer(a) and is_value_opaque_quantizer(MXFP8Quantizer())
    with pytest.raises(TypeError, match="identity semantics"):
        a.__fx_repr__()

    class TaggedValue(MXFP8Quantizer):
        tag: str

        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

    register_value_quantizer(TaggedValue)
    assert TaggedValue("a") != TaggedValue("b") and TaggedValue("a") == TaggedValue("a")
    assert is_value_opaque_quantizer(TaggedValue("a"))
    assert _rebuild(TaggedValue("x")).tag == "x"


def test_registration_without_the_api_warns_once_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamo, "_registration_api", lambda: None)
    monkeypatch.setattr(dynamo, "_warned_missing_api", False)

    class A(MXFP8Quantizer):
        pass

    class B(MXFP8Quantizer):
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert register_value_quantizer(A) is A
        assert register_value_quantizer(B) is B
    assert len(caught) == 1 and "has no opaque-object API" in str(caught[0].message)
    assert not is_value_opaque_quantizer(A()) and not is_value_opaque_quantizer(B())
    assert A() == A() and hash(A()) == hash(A())  # value semantics hold without the API


def test_fx_repr_needs_nothing_from_the_surrounding_scope() -> None:
    """Every value quantizer's expression evaluates with only its own globals (no torch)."""
    for q in VALUE_CASES:
        expr, globals_ = q.__fx_repr__()
        assert "torch" not in globals_ and "torch." not in expr
        assert eval(expr, dict(globals_)) == q


def test_no_staticmethod_is_called_through_an_instance() -> None:
    """Dynamo's guards crash on ``self.some_staticmethod()`` of a value-opaque object: none here."""
    package = pathlib.Path(quant.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            static = {
                f.name
                for f in cls.body
                if isinstance(f, ast.FunctionDef) and any(getattr(d, "id", None) == "staticmethod" for d in f.decorator_list)
            }
            if not static:
                continue
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and node.attr in static
                ):
                    offenders.append(f"{path.name}:{node.lineno} self.{node.attr}")
    assert offenders == []
    quantizer_statics = [
        name
        for cls in (Quantizer, *VALUE_QUANTIZERS, Float8Quantizer)
        for klass in cls.__mro__
        for name, member in vars(klass).items()
        if isinstance(member, staticmethod) and klass is not object
    ]
    assert quantizer_statics == []  # quantizers define no staticmethods at all


# ------------------------------------------------------------------ frozen rebuilds
@pytest.mark.parametrize("q", VALUE_CASES, ids=repr)
def test_fx_code_rebuilds_one_frozen_quantizer_per_value(q: Quantizer) -> None:
    # Inductor's wrapper evaluates the expression on every call: it must not build anew.
    first, again = _rebuild(q), _rebuild(q.copy())
    assert first is again and first.is_frozen and first == q and hash(first) == hash(q)
    assert not q.is_frozen  # the caller's quantizer is left mutable


def test_a_frozen_quantizer_refuses_every_change_and_copies_mutable() -> None:
    frozen = _rebuild(Float8CurrentScalingQuantizer(columnwise_usage=True))
    with pytest.raises(AttributeError, match=r"Float8CurrentScalingQuantizer is frozen .*'columnwise_usage'"):
        frozen.set_usage(columnwise=False)
    with pytest.raises(AttributeError, match=r"cannot set 'amax_epsilon'"):
        frozen.amax_epsilon = 1.0
    assert frozen.columnwise_usage and frozen.amax_epsilon == 0.0  # unchanged
    mutable = frozen.copy()
    assert not mutable.is_frozen and mutable == frozen
    mutable.set_usage(columnwise=False)
    assert mutable != frozen and frozen.columnwise_usage


def test_a_tensor_shares_a_frozen_quantizer_and_copies_a_mutable_one() -> None:
    x = torch.randn(32, 64)
    q = Float8CurrentScalingQuantizer()
    assert q.quantize(x)._quantizer is not q  # a later set_usage on q must not reach the tensor
    frozen = _rebuild(q)
    assert frozen.quantize(x)._quantizer is frozen
    assert frozen.make_empty((32, 64))._quantizer is frozen


def test_identity_quantizers_cannot_be_frozen() -> None:
    with pytest.raises(TypeError, match="Float8Quantizer has identity semantics"):
        Float8Quantizer().freeze()


def test_a_rebuild_first_evaluated_in_a_fake_trace_holds_real_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x0F0F)
    with FakeTensorMode():
        rebuilt = _rebuild(q)
    assert not isinstance(rebuilt.rht_matrix, FakeTensor) and torch.equal(rebuilt.rht_matrix, q.rht_matrix)


def test_usage_variants_are_frozen_and_the_original_is_untouched() -> None:
    from tetrt_support.quant.ops import with_usage

    q = MXFP8Quantizer(columnwise_usage=True)
    rowwise = with_usage(q, columnwise=False)
    assert rowwise.is_frozen and rowwise is with_usage(q.copy(), columnwise=False)
    assert (rowwise.rowwise_usage, rowwise.columnwise_usage) == (True, False) and q.columnwise_usage


def test_a_compiled_region_that_mutates_its_quantizer_fails_loudly_and_the_shared_constant_keeps_its_value() -> None:
    # Dynamo writes the mutation into the graph as a setattr on the graph's rebuilt constant;
    # that constant is shared between calls, so it must refuse rather than change.
    def step(x: torch.Tensor, q: MXFP8Quantizer) -> torch.Tensor:
        q.set_usage(columnwise=False)
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    with pytest.raises(AttributeError, match=r"MXFP8Quantizer is frozen .*cannot set 'columnwise_usage'"):
        compiled(torch.randn(4), MXFP8Quantizer())
    shared = _rebuild(MXFP8Quantizer())
    assert shared.columnwise_usage and shared == MXFP8Quantizer()
    torch._dynamo.reset()


def test_a_frozen_quantizers_derived_matrix_cannot_be_changed_through_its_accessor() -> None:
    shared = _rebuild(NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x3C3C))
    expected = shared.rht_matrix.clone()
    shared.rht_matrix.zero_()  # a caller's in-place change lands on a copy
    assert torch.equal(shared.rht_matrix, expected)

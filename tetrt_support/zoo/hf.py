"""Every model family of the installed transformers that computes with complex numbers, tiny.

Each family is a zoo entry (:data:`~tetrt_support.zoo.registry.ZOO`) that builds its model from
a tiny seeded config, makes keyword example inputs and names its dynamic dims. Complex numbers
enter by rotary embeddings (``llama4``, ``deepseek_v2``), FFTs (``fnet``, ``autoformer``) or a
vocoder's ISTFT head (``wavtokenizer``, ``xcodec2``, ``neucodec``, through
:class:`CodecDecoder`; ``xcodec2_model`` and ``neucodec_model`` are the whole models). Which
whole models do not export: ``docs/architecture.md``, section 4.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tetrt_support.zoo.registry import ZooEntry, register_model, seeded

__all__ = ["CODEC_HOP", "CodecDecoder"]

#: the dynamic sequence dim's upper bound of every family
MAX_SEQ = 32


def _transformers() -> Any:
    with warnings.catch_warnings():
        # transformers imports tqdm.auto, which warns without ipywidgets in a notebook
        warnings.filterwarnings("ignore", message="IProgress not found")
        import transformers
    return transformers


class CodecDecoder(nn.Module):
    """``forward(audio_codes)`` is ``codec.decode(audio_codes=audio_codes)``.

    An audio codec's ``forward`` encodes and decodes; its complex numbers live in the
    decoder's ISTFT head, and a deployment compiles the decoder alone, as here. Returns the
    codec's own decoder ``ModelOutput``.
    """

    def __init__(self, codec: nn.Module) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, audio_codes: torch.Tensor) -> Any:
        return self.codec.decode(audio_codes=audio_codes)


#: ``(model, batch, seq, generator) -> keyword inputs``
KeywordInputs = Callable[[nn.Module, int, int, torch.Generator], dict[str, torch.Tensor]]


def _family(
    name: str, module: str, description: str, make: Callable[[Any], nn.Module], inputs: KeywordInputs,
    dynamic: Callable[[Any, Any], dict[str, Any]], seq: int = 8,
) -> ZooEntry:
    """A zoo entry for the family built by ``make(transformers)``, fed ``model(**inputs)``."""

    def build(seed: int) -> nn.Module:
        t = _transformers()
        return seeded(lambda: make(t))(seed)

    def keyword_inputs(model: nn.Module, batch: int, seq: int, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), inputs(model, batch, seq, torch.Generator().manual_seed(seed))

    return ZooEntry(name, description, build, keyword_inputs, dynamic, module=module, seq=seq, max_seq=MAX_SEQ)


def _ids(model: nn.Module, batch: int, seq: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)}


def _codes(levels: int) -> Callable[[nn.Module, int, int, torch.Generator], dict[str, torch.Tensor]]:
    def make(model: nn.Module, batch: int, seq: int, g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"audio_codes": torch.randint(0, levels, (batch, 1, seq), generator=g)}

    return make


def _llama4_text(moe: bool) -> Callable[[Any], nn.Module]:
    def make(t: Any) -> nn.Module:
        from tetrt_support.zoo.rope import llama4_config

        return t.Llama4ForCausalLM(llama4_config(2, with_moe=moe))

    return make


def _llama4_vision(t: Any) -> nn.Module:
    # pixel shuffle (ratio 0.5) turns hidden 32 into 128 = intermediate_size, the projector input
    config = t.Llama4VisionConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
        vision_output_dim=32, image_size=56, patch_size=14, projector_input_dim=32, projector_output_dim=32,
    )  # fmt: skip
    return t.Llama4VisionModel(config)


def _pixels(model: nn.Module, batch: int, seq: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    size = model.config.image_size
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=g)}


def _deepseek_v2(moe: bool) -> Callable[[Any], nn.Module]:
    def make(t: Any) -> nn.Module:
        config = t.DeepseekV2Config(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, head_dim=8,
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
            first_k_dense_replace=0 if moe else 2,  # the first k layers are dense
            max_position_embeddings=128, use_cache=False,
        )  # fmt: skip
        return t.DeepseekV2ForCausalLM(config)

    return make


def _fnet(tpu: bool) -> Callable[[Any], nn.Module]:
    def make(t: Any) -> nn.Module:
        config = t.FNetConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
            max_position_embeddings=64, use_tpu_fourier_optimizations=tpu, tpu_short_seq_length=8,
        )  # fmt: skip
        return t.FNetModel(config)

    return make


def _autoformer(t: Any) -> nn.Module:
    config = t.AutoformerConfig(
        prediction_length=4, context_length=8, lags_sequence=[1, 2], d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_ffn_dim=16, decoder_ffn_dim=16,
        encoder_attention_heads=2, decoder_attention_heads=2, num_time_features=1,
        moving_average=3, label_length=4, use_cache=False,
    )  # fmt: skip
    return t.AutoformerModel(config)


def _autoformer_inputs(model: nn.Module, batch: int, seq: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    c = model.config
    past = c.context_length + max(c.lags_sequence)
    return {
        "past_values": torch.randn(batch, past, generator=g),
        "past_time_features": torch.randn(batch, past, c.num_time_features, generator=g),
        "past_observed_mask": torch.ones(batch, past),
        "future_values": torch.randn(batch, c.prediction_length, generator=g),
        "future_time_features": torch.randn(batch, c.prediction_length, c.num_time_features, generator=g),
    }


def _wavtokenizer(t: Any) -> nn.Module:
    config = t.WavTokenizerConfig(
        num_filters=4, upsampling_ratios=[2, 2], hidden_size=16, codebook_size=32, codebook_dim=16,
        decoder_hidden_size=16, decoder_intermediate_size=32, decoder_num_layers=1,
        decoder_attention_num_groups=4, num_lstm_layers=1,
    )  # fmt: skip
    return CodecDecoder(t.WavTokenizerModel(config))


def _xcodec(config_name: str, model_name: str, **extra: Any) -> Callable[[Any], nn.Module]:
    def make(t: Any) -> nn.Module:
        semantic = {"model_type": "wav2vec2-bert", "hidden_size": 16, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "intermediate_size": 32, "output_hidden_size": 16}  # fmt: skip
        config = getattr(t, config_name)(
            **extra,
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, encoder_hidden_size=4, downsampling_ratios=[2, 2],
            quantization_dim=48,  # = hidden_size + the semantic model's hidden size
            quantization_levels=[4, 4], semantic_model_config=semantic,
        )  # fmt: skip
        return CodecDecoder(getattr(t, model_name)(config))

    return make


def _codec_model(config_name: str, model_name: str) -> Callable[[Any], nn.Module]:
    # The same tiny codec, its whole forward. With the default initializer_range (0.02) the
    # encoder's output is too small to leave the quantizer's centre: every code the same,
    # zero latents, silence out, and a comparison with eager that shows nothing.
    decoder_only = _xcodec(config_name, model_name, initializer_range=0.5)
    return lambda t: decoder_only(t).codec


def _wave_and_features(
    model: nn.Module, batch: int, seq: int, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """``seq`` frames: a wave of ``seq * hop_length`` samples and ``seq`` feature vectors."""
    features = model.config.semantic_model_config.feature_projection_input_dim
    return {
        "input_values": torch.randn(batch, 1, seq * model.hop_length, generator=g),
        "input_features": torch.randn(batch, seq, features, generator=g),
    }


#: the encoders' hop in samples per frame: the product of the recipe's downsampling_ratios
CODEC_HOP = 4


def _wave_and_features_dynamic(b: Any, s: Any) -> dict[str, Any]:
    return {"input_values": {0: b, 2: CODEC_HOP * s}, "input_features": {0: b, 1: s}}


def _batch_seq(*names: str) -> Callable[[Any, Any], dict[str, Any]]:
    return lambda b, s: {n: {0: b, 1: s} for n in names}


def _codes_dynamic(b: Any, s: Any) -> dict[str, Any]:
    return {"audio_codes": {0: b, 2: s}}  # [batch, codebooks (1), codes]


for _entry in (
    _family("llama4_text", "llama4", "Llama4ForCausalLM, 2 dense layers", _llama4_text(False), _ids, _batch_seq("input_ids")),
    _family("llama4_text_moe", "llama4", "Llama4ForCausalLM, 2 MoE layers", _llama4_text(True), _ids, _batch_seq("input_ids")),
    _family("llama4_vision", "llama4", "Llama4VisionModel, 1 layer, 56x56 image", _llama4_vision, _pixels, lambda b, s: {"pixel_values": {0: b}}),
    _family("deepseek_v2", "deepseek_v2", "DeepseekV2ForCausalLM, 2 dense layers", _deepseek_v2(False), _ids, _batch_seq("input_ids")),
    _family("deepseek_v2_moe", "deepseek_v2", "DeepseekV2ForCausalLM, 2 MoE layers (4 experts, top 2)", _deepseek_v2(True), _ids, _batch_seq("input_ids")),
    _family("fnet", "fnet", "FNetModel, torch.fft.fftn token mixing", _fnet(False), _ids, _batch_seq("input_ids")),
    _family("fnet_tpu", "fnet", "FNetModel, DFT-matrix einsum token mixing", _fnet(True), _ids, lambda b, s: {"input_ids": {0: b}}),  # its DFT matrix fixes the sequence length,
    _family("autoformer", "autoformer", "AutoformerModel, FFT auto-correlation", _autoformer, _autoformer_inputs, lambda b, s: {k: {0: b} for k in ("past_values", "past_time_features", "past_observed_mask", "future_values", "future_time_features")}),
    _family("wavtokenizer", "wavtokenizer", "WavTokenizerModel.decode, ISTFT head", _wavtokenizer, _codes(32), _codes_dynamic, seq=6),
    _family("xcodec2", "xcodec2", "Xcodec2Model.decode, ISTFT head", _xcodec("Xcodec2Config", "Xcodec2Model"), _codes(16), _codes_dynamic, seq=6),
    _family("neucodec", "neucodec", "NeuCodecModel.decode, ISTFT head", _xcodec("NeuCodecConfig", "NeuCodecModel"), _codes(16), _codes_dynamic, seq=6),
    _family(
        "xcodec2_model", "xcodec2",
        "Xcodec2Model(input_values, input_features): encode, decode",
        _codec_model("Xcodec2Config", "Xcodec2Model"), _wave_and_features,
        _wave_and_features_dynamic, seq=6,
    ),
    _family(  # batch only: export specialises its length (int(length * 1.5) in its forward)
        "neucodec_model", "neucodec",
        "NeuCodecModel(input_values, input_features): encode, decode",
        _codec_model("NeuCodecConfig", "NeuCodecModel"), _wave_and_features,
        lambda b, s: {"input_values": {0: b}, "input_features": {0: b}}, seq=6,
    ),
):
    register_model(_entry)


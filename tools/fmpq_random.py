"""FMPQ (w4a4 recipes) activation layout for the random-weight benchmark models: per decoder linear input, a block
map of 128-channel blocks (int8 or int4) and an input permutation, laid out as `lowbit quantize --algo fmpq`
writes them (python/lowbit/quantize/fmpq.py): the permutation puts the outlier channels first, so the int8 blocks
are the first ones; q/k/v share one permutation and one map, as do gate/up; o_proj has its own; down_proj has
none (the quantizer folds it into the gate/up rows). Random weights carry no outliers, so the int8 fraction is a
budget (the issue's GEMM target uses 10%), and the permutation a seeded random one: the GPU quantizer gathers
x[:, perm] itself, so a real checkpoint's gather cost is in the measurement."""
import torch

BLOCK = 128
INT8_FRACTION = 0.1
# decoder linear -> the input it reads (linears reading one input share its map and permutation)
INPUTS = {"self_attn.q_proj": "attn_in", "self_attn.k_proj": "attn_in", "self_attn.v_proj": "attn_in",
          "self_attn.o_proj": "o", "mlp.gate_proj": "mlp_in", "mlp.up_proj": "mlp_in", "mlp.down_proj": "down"}
PERMUTED = ("attn_in", "o", "mlp_in")


def block_bits(k, int8_fraction=INT8_FRACTION):
    """u8 [ceil(k / 128)]: the first round-half-up(fraction x blocks) blocks 8, the rest 4 (the quantizer's rule)."""
    nb = (k + BLOCK - 1) // BLOCK
    bits = torch.full((nb,), 4, dtype=torch.uint8)
    bits[: int(int8_fraction * nb + 0.5)] = 8
    return bits


def permutation(layer, site, k):
    """s32 [k], a random permutation seeded by the layer and the input (so q/k/v, and gate/up, get the same)."""
    g = torch.Generator().manual_seed(1000 * layer + PERMUTED.index(site))
    return torch.randperm(k, generator=g).to(torch.int32)


def inputs(name, k, int8_fraction=INT8_FRACTION):
    """(block map, input permutation or None) of decoder linear `name` (model.layers.{i}.<suffix>.weight, input
    width k). The caller permutes the weight's input columns by the permutation, as the quantizer does, so the
    model computes the same function as without it."""
    parts = name.split(".")
    layer, site = int(parts[2]), INPUTS[".".join(parts[3:5])]
    return block_bits(k, int8_fraction), permutation(layer, site, k) if site in PERMUTED else None


def describe(shape, int8_fraction=INT8_FRACTION):
    """The layout as recorded beside the results: the fraction asked for and, per input width, the one obtained."""
    widths = sorted({shape.hidden, shape.q_size, shape.inter})
    return {"int8_fraction": int8_fraction, "block": BLOCK,
            "int8_block_fraction_by_k": {str(k): round(float((block_bits(k, int8_fraction) == 8).float().mean()), 4)
                                         for k in widths},
            "int8_blocks": "the first blocks of each input (the quantizer's permutation puts outliers first)",
            "input_permutations": "random, one per layer input: q/k/v shared, o_proj, gate/up shared; "
                                  "down_proj none (folded into gate/up by the quantizer)"}

"""A real GGUF model file of another quantization type, made from the shipped SmolLM2 Q4_1 file the way llama.cpp's
quantizer would write it: every metadata field and the tokenizer copied, each 2-D weight dequantized by gguf-py and
re-encoded by gguf-py's own quantizer, 1-D tensors (norms) kept as f32. Used by the CPU and GPU whole-file tests."""
import numpy as np

LLAMA_FILE_TYPES = {"Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1"}


def rewrite_smollm2(path, linear_type: str, embedding_type: str | None = None) -> str:
    """Writes `path`: SmolLM2 with its decoder linears in `linear_type` and `token_embd.weight` (the tied output
    layer) in `embedding_type` (default: the same type). Both must be types gguf-py quantizes."""
    import gguf

    from lowbit.models import default_model_path
    qtypes = {name: getattr(gguf.GGMLQuantizationType, name) for name in {linear_type, embedding_type or linear_type}}
    src = gguf.GGUFReader(str(default_model_path()))
    w = gguf.GGUFWriter(str(path), "llama")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer adds its own header and architecture
        value = field.contents()
        if field.name == "general.file_type":
            value = int(getattr(gguf.LlamaFileType, LLAMA_FILE_TYPES[linear_type]))
        w.add_key_value(field.name, value, field.types[0], field.types[1] if len(field.types) > 1 else None)
    for t in src.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if values.ndim == 2:
            qtype = qtypes[embedding_type or linear_type] if t.name == "token_embd.weight" else qtypes[linear_type]
            blocks = gguf.quants.quantize(values, qtype)
            w.add_tensor(t.name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)

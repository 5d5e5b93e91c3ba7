// masked_attention_plugin.cpp: WideMaskedAttention shapes, types and launch (wide_masked_attention).
// Inputs q [B, Hq, T, D], k / v [B, Hk, S, D] (past and new keys), allowed bool [B, 1, T, S] (causal and not
// padding: the op's contract, which lets the kernel leave out keys after each query), head_mask int32
// [B, T, Hq / group_heads]; output [B, Hq, T, D] of q's type. One launch for prefill and decode profiles.
#include "masked_attention_plugin.h"

#include <climits>
#include <cstdint>

namespace wide
{
namespace trt
{

using namespace nvinfer1;

namespace
{
constexpr int64_t kMaxHeadDim = 128; // the largest head-size class of the kernels' cubins
} // namespace

std::vector<std::string> MaskedAttentionPlugin::fieldNames()
{
    return {"group_heads"};
}

std::vector<int32_t> MaskedAttentionPlugin::fieldDefaults()
{
    return {INT32_MIN};
}

MaskedAttentionPlugin::MaskedAttentionPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, std::move(fields))
{
    check(field("group_heads") > 0, kName, "group_heads must be > 0, got " + std::to_string(field("group_heads")));
}

bool MaskedAttentionPlugin::supportsType(int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const
{
    DataType const type = inOut[pos].desc.type;
    switch (pos)
    {
    case 0: return isActivationType(type);             // q
    case 3: return type == DataType::kBOOL;            // allowed
    case 4: return type == DataType::kINT32;           // head_mask
    default: return type == inOut[0].desc.type;        // k, v and the output: q's type
    }
}

DataType MaskedAttentionPlugin::outputType(DataType const* inputTypes) const
{
    check(isActivationType(inputTypes[0]), name(), "q must be float32, float16 or bfloat16");
    return inputTypes[0];
}

void MaskedAttentionPlugin::outputShape(DimsExprs const* inputs, DimsExprs& output, IExprBuilder& /*exprBuilder*/) const
{
    check(inputs[0].nbDims == 4, name(), "q must be [B, Hq, T, D]");
    output = inputs[0];
}

void MaskedAttentionPlugin::validateDims(Dims const* in, Dims const& out) const
{
    Dims const& q = in[0];
    Dims const& k = in[1];
    Dims const& v = in[2];
    Dims const& allowed = in[3];
    Dims const& mask = in[4];
    int64_t const gh = field("group_heads");
    check(q.nbDims == 4 && k.nbDims == 4 && v.nbDims == 4, name(), "q, k and v must be [B, H, T or S, D]");
    for (int i = 0; i < 4; ++i)
    {
        check(dimsCompatible(k.d[i], v.d[i]), name(), "k and v must have one shape");
    }
    int64_t const B = q.d[0], Hq = q.d[1], T = q.d[2], D = q.d[3];
    int64_t const Hk = k.d[1], S = k.d[2];
    check(dimsCompatible(k.d[0], B) && dimsCompatible(k.d[3], D), name(), "k must be [B, Hk, S, D] with q's B and D");
    check(Hq < 0 || Hk < 0 || (Hk > 0 && Hq % Hk == 0), name(), "Hq must be a multiple of Hk (GQA)");
    check(Hq < 0 || Hq % gh == 0, name(),
        "Hq = " + std::to_string(Hq) + " is not a multiple of group_heads = " + std::to_string(gh));
    check(D < 0 || (D <= kMaxHeadDim && D % 16 == 0), name(),
        "head size " + std::to_string(D) + " is not a multiple of 16 up to 128 (the kernels' cubins)");
    check(S < 0 || T < 0 || S >= T, name(), "k has fewer keys (S) than q has queries (T)");
    check(allowed.nbDims == 4 && dimsCompatible(allowed.d[0], B) && dimsCompatible(allowed.d[1], 1)
            && dimsCompatible(allowed.d[2], T) && dimsCompatible(allowed.d[3], S),
        name(), "allowed must be [B, 1, T, S]");
    check(mask.nbDims == 3 && dimsCompatible(mask.d[0], B) && dimsCompatible(mask.d[1], T)
            && (Hq < 0 || dimsCompatible(mask.d[2], Hq / gh)),
        name(), "head_mask must be [B, T, Hq / group_heads]");
    check(out.nbDims == 4, name(), "the output must be [B, Hq, T, D]");
}

namespace
{
//! The kernel's sizes of these dims (pointers null, dtype float16: the workspace size reads neither).
wide_attention_params_t sizesOf(Dims const* in, int64_t groupHeads)
{
    wide_attention_params_t p{};
    p.B = in[0].d[0];
    p.Hq = in[0].d[1];
    p.T = in[0].d[2];
    p.D = in[0].d[3];
    p.Hk = in[1].d[1];
    p.S = in[1].d[2];
    p.group_heads = groupHeads;
    p.dtype = WIDE_FLOAT16;
    return p;
}
} // namespace

size_t MaskedAttentionPlugin::workspaceFor(Dims const* in, DataType /*type*/) const
{
    // decode (one query): the float32 partials of the split over the keys, at the largest batch and keys
    wide_attention_params_t const p = sizesOf(in, field("group_heads"));
    return wide_masked_attention_workspace_size(&p);
}

void MaskedAttentionPlugin::run(PluginTensorDesc const* inputDesc, PluginTensorDesc const& /*outputDesc*/,
    void const* const* inputs, void* output, void* workspace, size_t workspaceSize, cudaStream_t stream) const
{
    Dims const dims[2] = {inputDesc[0].dims, inputDesc[1].dims};
    wide_attention_params_t p = sizesOf(dims, field("group_heads"));
    p.q = inputs[0];
    p.k = inputs[1];
    p.v = inputs[2];
    p.allowed = static_cast<uint8_t const*>(inputs[3]);
    p.head_mask = static_cast<int32_t const*>(inputs[4]);
    p.y = output;
    p.dtype = toWideDtype(inputDesc[0].type);
    checkKernel(name(), wide_masked_attention(&p, workspace, workspaceSize, stream));
}

} // namespace trt
} // namespace wide

// wide_gemm_plugin.cpp: shapes, types and launch of the masked-GEMM plugins.
#include "wide_gemm_plugin.h"

namespace wide
{
namespace trt
{

using namespace nvinfer1;

namespace
{

std::string str(int64_t v)
{
    return std::to_string(v);
}

} // namespace

WideGemmPlugin::WideGemmPlugin(std::string name, std::vector<IntField> fields, GemmSpec spec)
    : WidePlugin(std::move(name), std::move(fields))
    , mSpec(spec)
{
    check(field("group_size") > 0, this->name(), "group_size must be > 0, got " + str(field("group_size")));
}

int32_t WideGemmPlugin::minInputs() const
{
    return maskIndex() + 1 + (mSpec.hasBias ? 1 : 0);
}

int32_t WideGemmPlugin::maxInputs() const
{
    return maskIndex() + 1 + (mSpec.biasInput ? 1 : 0);
}

bool WideGemmPlugin::supportsType(int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const
{
    DataType const type = inOut[pos].desc.type;
    if (pos == 0)
    {
        return isActivationType(type);
    }
    if (pos == maskIndex())
    {
        return type == DataType::kINT32;
    }
    // weights, bias and the output share the activation type of x.
    return type == inOut[0].desc.type;
}

DataType WideGemmPlugin::outputType(DataType const* inputTypes) const
{
    check(isActivationType(inputTypes[0]), name(), "x must be float32, float16 or bfloat16");
    return inputTypes[0];
}

void WideGemmPlugin::outputShape(DimsExprs const* inputs, DimsExprs& output, IExprBuilder& /*exprBuilder*/) const
{
    check(inputs[1].nbDims == 2, name(), "weight must be 2-D [N, K]");
    output = inputs[0];
    output.d[output.nbDims - 1] = inputs[1].d[0];
}

void WideGemmPlugin::validateDims(Dims const* in, Dims const& out) const
{
    Dims const& x = in[0];
    Dims const& w = in[1];
    Dims const& mask = in[maskIndex()];
    int64_t const K = x.d[x.nbDims - 1];
    int64_t const N = w.d[0];
    int64_t const G = mask.d[mask.nbDims - 1];
    int64_t const gs = field("group_size");
    check(x.nbDims >= 2, name(), "x must have rank >= 2");
    for (int32_t i = 1; i <= mSpec.nbWeights; ++i)
    {
        check(in[i].nbDims == 2 && dimsCompatible(in[i].d[1], K) && dimsCompatible(in[i].d[0], N), name(),
            "weight " + str(i) + " must be [N, K] with K = " + str(K) + " (the last dim of x)");
    }
    check(mask.nbDims == x.nbDims, name(), "mask must have the rank of x ([..., G])");
    for (int32_t i = 0; i + 1 < x.nbDims; ++i)
    {
        check(dimsCompatible(mask.d[i], x.d[i]), name(), "mask and x disagree in dim " + str(i));
    }
    int64_t const grouped = mSpec.groupsAlongK ? K : N;
    if (grouped >= 0)
    {
        check(grouped % gs == 0, name(),
            std::string(mSpec.groupsAlongK ? "K" : "N") + " = " + str(grouped) + " is not a multiple of group_size "
                + str(gs));
        check(dimsCompatible(G, grouped / gs), name(),
            "mask has " + str(G) + " groups but " + (mSpec.groupsAlongK ? "K" : "N") + " / group_size = "
                + str(grouped / gs));
    }
    if (nbInputs() > maskIndex() + 1)
    {
        Dims const& b = in[maskIndex() + 1];
        check(b.nbDims == 1 && dimsCompatible(b.d[0], N), name(), "bias must be [N]");
    }
    check(out.nbDims == x.nbDims && dimsCompatible(out.d[out.nbDims - 1], N), name(), "output must be [..., N]");
}

wide_gemm_params_t WideGemmPlugin::params(Dims const* in, DataType type) const
{
    Dims const& x = in[0];
    wide_gemm_params_t p{};
    p.M = leadingRows(x);
    p.K = x.d[x.nbDims - 1];
    p.N = in[1].d[0];
    p.group_size = field("group_size");
    p.dtype = toWideDtype(type);
    p.algo = WIDE_ALGO_AUTO;
    return p;
}

size_t WideGemmPlugin::workspaceFor(Dims const* inputs, DataType type) const
{
    wide_gemm_params_t const p = params(inputs, type);
    return wide_gemm_workspace_size(&p);
}

void WideGemmPlugin::run(PluginTensorDesc const* inputDesc, PluginTensorDesc const& /*outputDesc*/,
    void const* const* inputs, void* output, void* workspace, size_t workspaceSize, cudaStream_t stream) const
{
    std::vector<Dims> dims;
    for (int32_t i = 0; i < nbInputs(); ++i)
    {
        dims.push_back(inputDesc[i].dims);
    }
    wide_gemm_params_t p = params(dims.data(), inputDesc[0].type);
    p.x = inputs[0];
    p.w = inputs[1];
    p.w2 = mSpec.nbWeights == 2 ? inputs[2] : nullptr;
    p.mask = static_cast<int32_t const*>(inputs[maskIndex()]);
    p.bias = mSpec.hasBias ? inputs[maskIndex() + 1] : nullptr;
    p.y = output;
    checkKernel(name(), mSpec.kernel(&p, workspace, workspaceSize, stream));
}

} // namespace trt
} // namespace wide

// router_plugin.cpp: WideRouter shapes, types and launch (wide_router).
#include "router_plugin.h"

#include <climits>

namespace wide
{
namespace trt
{

using namespace nvinfer1;

std::vector<std::string> RouterPlugin::fieldNames()
{
    return {"num_groups"};
}

std::vector<int32_t> RouterPlugin::fieldDefaults()
{
    return {INT32_MIN};
}

RouterPlugin::RouterPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, std::move(fields))
{
    check(field("num_groups") > 0, kName, "num_groups must be > 0, got " + std::to_string(field("num_groups")));
}

bool RouterPlugin::supportsType(int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const
{
    DataType const type = inOut[pos].desc.type;
    if (pos == 0)
    {
        return isActivationType(type);
    }
    if (pos < nbInputs)
    {
        return type == DataType::kFLOAT; // router weights are always float32
    }
    return type == DataType::kINT32; // the mask
}

DataType RouterPlugin::outputType(DataType const* inputTypes) const
{
    check(isActivationType(inputTypes[0]), name(), "hidden must be float32, float16 or bfloat16");
    return DataType::kINT32;
}

void RouterPlugin::outputShape(DimsExprs const* inputs, DimsExprs& output, IExprBuilder& exprBuilder) const
{
    output = inputs[0];
    output.d[output.nbDims - 1] = exprBuilder.constant(field("num_groups"));
}

void RouterPlugin::validateDims(Dims const* in, Dims const& out) const
{
    int64_t const H = in[0].d[in[0].nbDims - 1];
    int64_t const G = field("num_groups");
    Dims const& wc = in[1];
    Dims const& bc = in[2];
    Dims const& wr = in[3];
    Dims const& br = in[4];
    check(wc.nbDims == 2 && dimsCompatible(wc.d[1], H), name(), "compressor_weight must be [R, H]");
    int64_t const R = wc.d[0];
    check(bc.nbDims == 1 && dimsCompatible(bc.d[0], R), name(), "compressor_bias must be [R]");
    check(R <= 256, name(), "router rank R = " + std::to_string(R) + " is above the fused router's limit 256");
    check(wr.nbDims == 2 && dimsCompatible(wr.d[0], 2 * G) && dimsCompatible(wr.d[1], R), name(),
        "router_weight must be [2 * num_groups, R] = [" + std::to_string(2 * G) + ", R]");
    check(br.nbDims == 1 && dimsCompatible(br.d[0], 2 * G), name(), "router_bias must be [2 * num_groups]");
    check(out.nbDims == in[0].nbDims && dimsCompatible(out.d[out.nbDims - 1], G), name(), "mask must be [..., G]");
}

size_t RouterPlugin::workspaceFor(Dims const* in, DataType /*type*/) const
{
    // the split router's float32 partials (decode, up to 64 tokens); larger M runs the one-pass router
    return wide_router_workspace_size(leadingRows(in[0]), in[0].d[in[0].nbDims - 1], in[1].d[0]);
}

void RouterPlugin::run(PluginTensorDesc const* inputDesc, PluginTensorDesc const& /*outputDesc*/,
    void const* const* inputs, void* output, void* workspace, size_t workspaceSize, cudaStream_t stream) const
{
    Dims const& x = inputDesc[0].dims;
    int64_t const M = leadingRows(x);
    int64_t const H = x.d[x.nbDims - 1];
    int64_t const R = inputDesc[1].dims.d[0];
    int64_t const G = field("num_groups");
    int const status = wide_router_ws(inputs[0], toWideDtype(inputDesc[0].type), M, H,
        static_cast<float const*>(inputs[1]), static_cast<float const*>(inputs[2]), R,
        static_cast<float const*>(inputs[3]), static_cast<float const*>(inputs[4]), G, static_cast<int32_t*>(output),
        workspace, workspaceSize, stream);
    checkKernel(name(), status);
}

} // namespace trt
} // namespace wide

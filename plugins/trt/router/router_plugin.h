// router_plugin.h: WideRouter, the per-token group decision of one WIDE router.
// mask[..., g] = l[..., g, 0] >= l[..., g, 1],  l = (hidden Wc^T + bc) Wr^T + br  (fp32)
#ifndef WIDE_ROUTER_PLUGIN_H
#define WIDE_ROUTER_PLUGIN_H

#include "wide_plugin.h"

namespace wide
{
namespace trt
{

class RouterPlugin : public WidePluginT<RouterPlugin>
{
public:
    static constexpr char const* kName = "WideRouter";
    static std::vector<std::string> fieldNames();
    static std::vector<int32_t> fieldDefaults();
    explicit RouterPlugin(std::vector<IntField> fields);

protected:
    int32_t minInputs() const override { return 5; }
    bool supportsType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const override;
    nvinfer1::DataType outputType(nvinfer1::DataType const* inputTypes) const override;
    void outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs& output,
        nvinfer1::IExprBuilder& exprBuilder) const override;
    void validateDims(nvinfer1::Dims const* inputs, nvinfer1::Dims const& output) const override;
    size_t workspaceFor(nvinfer1::Dims const* inputs, nvinfer1::DataType type) const override;
    void run(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const& outputDesc,
        void const* const* inputs, void* output, void* workspace, size_t workspaceSize,
        cudaStream_t stream) const override;
};

using RouterCreator = WideCreator<RouterPlugin>;

} // namespace trt
} // namespace wide

#endif // WIDE_ROUTER_PLUGIN_H

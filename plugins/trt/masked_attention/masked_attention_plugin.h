// masked_attention_plugin.h: WideMaskedAttention, causal GQA attention of a routed layer with the heads of
// skipped groups left out: y = softmax(q k^T / sqrt(D) where allowed, else float32's lowest) v, then
// y[b, h, t] = 0 where head_mask[b, t, h / group_heads] == 0 (docs/opset.md).
#ifndef WIDE_MASKED_ATTENTION_PLUGIN_H
#define WIDE_MASKED_ATTENTION_PLUGIN_H

#include "wide_plugin.h"

namespace wide
{
namespace trt
{

class MaskedAttentionPlugin : public WidePluginT<MaskedAttentionPlugin>
{
public:
    static constexpr char const* kName = "WideMaskedAttention";
    static std::vector<std::string> fieldNames();
    static std::vector<int32_t> fieldDefaults();
    explicit MaskedAttentionPlugin(std::vector<IntField> fields);

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

using MaskedAttentionCreator = WideCreator<MaskedAttentionPlugin>;

} // namespace trt
} // namespace wide

#endif // WIDE_MASKED_ATTENTION_PLUGIN_H

// wide_gemm_plugin.h: the part the three masked-GEMM plugins share.
//
// Inputs are always (x, weight[, weight2], mask[, bias]) and the output is
// y [..., N]; what differs is how many weights there are, whether the groups
// split N (outputs) or K (inputs), whether a bias is allowed and which kernel
// launch function runs. A GemmSpec captures exactly that.
#ifndef WIDE_GEMM_PLUGIN_H
#define WIDE_GEMM_PLUGIN_H

#include "wide_plugin.h"

namespace wide
{
namespace trt
{

using GemmKernel = int (*)(wide_gemm_params_t const*, void*, size_t, cudaStream_t);

struct GemmSpec
{
    int32_t nbWeights;  //!< 1, or 2 for the gated MLP (gate, up)
    bool groupsAlongK;  //!< true: K == G * group_size (gemm_k); false: N == G * group_size
    bool biasInput;     //!< the node may carry a trailing bias input [N] (WideMaskedGemmN, WideMaskedGemmK)
    bool hasBias;       //!< ... and it is used (has_bias = 1); when 0 a present bias input is ignored
    GemmKernel kernel;  //!< launch function from wide_kernels.h
};

class WideGemmPlugin : public WidePlugin
{
public:
    WideGemmPlugin(std::string name, std::vector<IntField> fields, GemmSpec spec);

protected:
    int32_t minInputs() const override;
    int32_t maxInputs() const override;
    bool supportsType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const override;
    nvinfer1::DataType outputType(nvinfer1::DataType const* inputTypes) const override;
    void outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs& output,
        nvinfer1::IExprBuilder& exprBuilder) const override;
    void validateDims(nvinfer1::Dims const* inputs, nvinfer1::Dims const& output) const override;
    size_t workspaceFor(nvinfer1::Dims const* inputs, nvinfer1::DataType type) const override;
    void run(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const& outputDesc,
        void const* const* inputs, void* output, void* workspace, size_t workspaceSize,
        cudaStream_t stream) const override;

private:
    int32_t maskIndex() const { return 1 + mSpec.nbWeights; }
    //! Kernel parameters for these dims (pointers left null).
    wide_gemm_params_t params(nvinfer1::Dims const* inputs, nvinfer1::DataType type) const;

    GemmSpec mSpec;
};

} // namespace trt
} // namespace wide

#endif // WIDE_GEMM_PLUGIN_H

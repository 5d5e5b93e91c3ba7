// masked_gemm_k_plugin.h: WideMaskedGemmK, K-axis (input-group) pruned GEMM.
// y[..., n] = sum_k x[..., k] * mask[..., k / group_size] * weight[n, k] + bias[n]
#ifndef WIDE_MASKED_GEMM_K_PLUGIN_H
#define WIDE_MASKED_GEMM_K_PLUGIN_H

#include "wide_gemm_plugin.h"

namespace wide
{
namespace trt
{

class MaskedGemmKPlugin : public WidePluginT<MaskedGemmKPlugin, WideGemmPlugin>
{
public:
    static constexpr char const* kName = "WideMaskedGemmK";
    static std::vector<std::string> fieldNames();
    static std::vector<int32_t> fieldDefaults();
    explicit MaskedGemmKPlugin(std::vector<IntField> fields);
};

using MaskedGemmKCreator = WideCreator<MaskedGemmKPlugin>;

} // namespace trt
} // namespace wide

#endif // WIDE_MASKED_GEMM_K_PLUGIN_H

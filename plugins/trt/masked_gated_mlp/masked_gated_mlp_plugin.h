// masked_gated_mlp_plugin.h: WideMaskedGatedMlp, fused SiLU-gated gate/up with N-axis pruning.
// y[..., n] = silu(x . gate_weight[n]) * (x . up_weight[n]) * mask[..., n / group_size]
#ifndef WIDE_MASKED_GATED_MLP_PLUGIN_H
#define WIDE_MASKED_GATED_MLP_PLUGIN_H

#include "wide_gemm_plugin.h"

namespace wide
{
namespace trt
{

class MaskedGatedMlpPlugin : public WidePluginT<MaskedGatedMlpPlugin, WideGemmPlugin>
{
public:
    static constexpr char const* kName = "WideMaskedGatedMlp";
    static std::vector<std::string> fieldNames();
    static std::vector<int32_t> fieldDefaults();
    explicit MaskedGatedMlpPlugin(std::vector<IntField> fields);
};

using MaskedGatedMlpCreator = WideCreator<MaskedGatedMlpPlugin>;

} // namespace trt
} // namespace wide

#endif // WIDE_MASKED_GATED_MLP_PLUGIN_H

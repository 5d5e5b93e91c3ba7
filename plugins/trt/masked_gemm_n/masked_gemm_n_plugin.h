// masked_gemm_n_plugin.h: WideMaskedGemmN, N-axis (output-group) pruned GEMM.
// y[..., n] = (x[...] . weight[n] + bias[n]) * mask[..., n / group_size]
#ifndef WIDE_MASKED_GEMM_N_PLUGIN_H
#define WIDE_MASKED_GEMM_N_PLUGIN_H

#include "wide_gemm_plugin.h"

namespace wide
{
namespace trt
{

class MaskedGemmNPlugin : public WidePluginT<MaskedGemmNPlugin, WideGemmPlugin>
{
public:
    static constexpr char const* kName = "WideMaskedGemmN";
    static std::vector<std::string> fieldNames();
    static std::vector<int32_t> fieldDefaults();
    explicit MaskedGemmNPlugin(std::vector<IntField> fields);
};

using MaskedGemmNCreator = WideCreator<MaskedGemmNPlugin>;

} // namespace trt
} // namespace wide

#endif // WIDE_MASKED_GEMM_N_PLUGIN_H

// Mean average precision, the evaluation metric of multi-label data: per class, the average
// precision of the split's scores ranked high to low (sklearn's average_precision_score), then
// the mean over the classes that have a positive sample (torchmetrics'
// MultilabelAveragePrecision, average "macro": a class without one has no recall to average
// over and is left out, as it warns).
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::engine {

// `scores` and `targets`: [N, C] of any device and floating dtype; a target >= 0.5 counts as
// positive. Per class, AP = sum over the distinct scores, from high to low, of (R_k - R_(k-1))
// x P_k (tied scores are one threshold). NaN when no class has a positive sample or a score is
// NaN.
double mean_average_precision(const at::Tensor& scores, const at::Tensor& targets);

// Every rank's rows of `rows` ([n_r, C], CPU), rank after rank; the ranks' counts may differ.
// `rows` itself when `group` is null. Collective: every rank calls it.
at::Tensor gather_rows(const at::Tensor& rows, dist::ProcessGroup* group);

}  // namespace kiln::engine

#include "validation.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace virtual_noise {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void check_seeds(const char* op, const at::Tensor& seeds) {
  TORCH_CHECK_TYPE(at::isIntegralType(seeds.scalar_type(), /*includeBool=*/false), op,
                   ": `seeds` must be an integer tensor (int64 or int32); got dtype ",
                   seeds.scalar_type());
  TORCH_CHECK_VALUE(seeds.dim() == 1, op, ": `seeds` must be 1-D (one seed per individual",
                    " or per antithetic pair); got shape ", seeds.sym_sizes());
}

void check_same_device(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                       const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": `", name, "` must be on the same device as `",
                    ref_name, "` (", ref.device(), "); got ", t.device());
}

void check_sigma(const char* op, double sigma, bool nonzero) {
  TORCH_CHECK_VALUE(std::isfinite(sigma), op, ": `sigma` must be finite; got ", sigma);
  TORCH_CHECK_VALUE(!nonzero || sigma != 0.0, op,
                    ": `sigma` must be nonzero (the estimate divides by it); got 0");
}

// The block [offset, offset + block) of noise indices must fit in int64.
void check_offset(const char* op, int64_t offset, const c10::SymInt& block) {
  TORCH_CHECK_VALUE(offset >= 0, op, ": `offset` must be >= 0; got ", offset);
  TORCH_CHECK_VALUE(block <= kInt64Max - offset, op, ": `offset` + block size overflows int64 (offset ",
                    offset, ", block of ", block, " elements)");
}

c10::SymInt population(const at::Tensor& seeds, bool antithetic) {
  return seeds.sym_size(0) * (antithetic ? 2 : 1);
}

bool is_float_input(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

}  // namespace

namespace {

LinearDims check_linear(const char* op, const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, const at::Tensor& seeds, double sigma,
                        int64_t offset, bool antithetic, bool transposed) {
  check_seeds(op, seeds);
  TORCH_CHECK_TYPE(is_float_input(x.scalar_type()), op,
                   ": `x` must be float32, bfloat16 or float16; got ", x.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), op, ": `weight` must have x's dtype (",
                   x.scalar_type(), "); got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": `weight` must be 2-D ",
                    transposed ? "(in_features, out_features) with transposed=True" : "(out_features, in_features)",
                    "; got shape ", weight.sym_sizes());
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, op,
                    ": `x` must be (batch, in_features) or (P, batch, in_features); got shape ", x.sym_sizes());
  check_same_device(op, "weight", weight, "x", x);
  check_same_device(op, "seeds", seeds, "x", x);
  check_sigma(op, sigma, /*nonzero=*/false);

  LinearDims d{};
  d.n_seeds = seeds.sym_size(0);
  d.pop = population(seeds, antithetic);
  d.shared_x = x.dim() == 2;
  d.batch = x.sym_size(-2);
  d.in_features = weight.sym_size(transposed ? 0 : 1);
  d.out_features = weight.sym_size(transposed ? 1 : 0);
  d.has_bias = bias.has_value();
  TORCH_CHECK_VALUE(x.sym_size(-1) == d.in_features, op, ": `x` has ", x.sym_size(-1),
                    " features in its last dim but `weight` is ", weight.sym_sizes(),
                    transposed ? " with transposed=True" : "", " (expects ", d.in_features, ")");
  if (!d.shared_x) {
    TORCH_CHECK_VALUE(x.sym_size(0) == d.pop, op, ": per-individual `x` must have size(0) == population ",
                      d.pop, antithetic ? " (2 * len(seeds), antithetic)" : " (len(seeds))", "; got ",
                      x.sym_size(0));
  }
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), op, ": `bias` must have x's dtype (",
                     x.scalar_type(), "); got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == d.out_features, op,
                      ": `bias` must be 1-D of size out_features = ", d.out_features, "; got shape ",
                      bias->sym_sizes());
    check_same_device(op, "bias", *bias, "x", x);
  }
  // Weight and bias noise occupy offset .. offset + out*in + out.
  check_offset(op, offset, d.out_features * d.in_features + (d.has_bias ? d.out_features : c10::SymInt(0)));
  return d;
}

void check_shape_2d(const char* op, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(shape.size() == 2, op, ": `weight_shape` must have 2 dims; got ", shape);
  for (const int64_t s : shape)
    TORCH_CHECK_VALUE(s >= 0, op, ": `weight_shape` must be non-negative; got ", shape);
}

}  // namespace

LinearDims check_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                  double sigma, int64_t offset, bool antithetic, bool transposed) {
  return check_linear("virtual_noise.perturbed_linear", x, weight, bias, seeds, sigma, offset, antithetic,
                      transposed);
}

void check_rank(const char* op, int64_t rows, int64_t cols, int64_t rank) {
  TORCH_CHECK_VALUE(rank >= 1, op, ": `rank` must be >= 1; got ", rank);
  int64_t factors = 0, block = 0;
  const bool overflow = __builtin_add_overflow(rows, cols, &factors) ||
                        __builtin_mul_overflow(factors, rank, &factors) ||
                        __builtin_mul_overflow(rows, cols, &block);
  TORCH_CHECK_VALUE(!overflow && factors <= block, op, ": `rank` ", rank, " is too large for the (", rows, ", ",
                    cols, ") block: its factors, (rows + cols) * rank = ", factors,
                    " noise elements, must fit in the block's rows * cols = ", block);
}

LinearDims check_lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                          double sigma, int64_t offset, int64_t rank, bool antithetic,
                                          bool transposed) {
  const char* op = "virtual_noise.lowrank_perturbed_linear";
  const LinearDims d = check_linear(op, x, weight, bias, seeds, sigma, offset, antithetic, transposed);
  if (weight.dim() == 2 && !weight.sym_size(0).is_symbolic() && !weight.sym_size(1).is_symbolic())
    check_rank(op, weight.size(0), weight.size(1), rank);
  else
    TORCH_CHECK_VALUE(rank >= 1, op, ": `rank` must be >= 1; got ", rank);
  return d;
}

int64_t check_lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                      at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                      int64_t offset, int64_t rank, bool antithetic) {
  const char* op = "virtual_noise.lowrank_weight_gradient";
  const int64_t n = check_noise_gradient(op, "weight_shape", 2, fitness, seeds, weight_shape, sigma, pop_size,
                                         offset, antithetic);
  check_rank(op, weight_shape[0], weight_shape[1], rank);
  return n;
}

void check_generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset) {
  const char* op = "virtual_noise.generate_lowrank_noise";
  check_seeds(op, seeds);
  check_shape_2d(op, weight_shape);
  check_rank(op, weight_shape[0], weight_shape[1], rank);
  check_offset(op, offset, c10::SymInt(weight_shape[0] * weight_shape[1]));
}

EmbeddingDims check_perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                                        const at::Tensor& seeds, double sigma, int64_t offset,
                                        bool antithetic) {
  const char* op = "virtual_noise.perturbed_embedding";
  check_seeds(op, seeds);
  TORCH_CHECK_TYPE(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
                   ": `indices` must be int64 or int32; got dtype ", indices.scalar_type());
  TORCH_CHECK_VALUE(indices.dim() == 1 || indices.dim() == 2, op,
                    ": `indices` must be (n,) shared by the population or (P, n) per individual; got shape ",
                    indices.sym_sizes());
  TORCH_CHECK_TYPE(is_float_input(weight.scalar_type()), op,
                   ": `weight` must be float32, bfloat16 or float16; got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": `weight` must be 2-D (num_embeddings, embedding_dim); got shape ",
                    weight.sym_sizes());
  check_same_device(op, "weight", weight, "indices", indices);
  check_same_device(op, "seeds", seeds, "indices", indices);
  check_sigma(op, sigma, /*nonzero=*/false);
  EmbeddingDims d{};
  d.n_seeds = seeds.sym_size(0);
  d.pop = population(seeds, antithetic);
  d.shared = indices.dim() == 1;
  d.n_indices = indices.sym_size(-1);
  d.num_embeddings = weight.sym_size(0);
  d.dim = weight.sym_size(1);
  if (!d.shared) {
    TORCH_CHECK_VALUE(indices.sym_size(0) == d.pop, op,
                      ": per-individual `indices` must have size(0) == population ", d.pop,
                      antithetic ? " (2 * len(seeds), antithetic)" : " (len(seeds))", "; got ",
                      indices.sym_size(0));
  }
  check_offset(op, offset, d.num_embeddings * d.dim);
  return d;
}

void check_embedding_indices(const at::Tensor& indices, int64_t num_embeddings) {
  if (indices.numel() == 0) return;
  const int64_t lo = indices.min().item<int64_t>(), hi = indices.max().item<int64_t>();
  TORCH_CHECK_INDEX(lo >= 0 && hi < num_embeddings, "virtual_noise.perturbed_embedding: every entry of ",
                    "`indices` must be in [0, num_embeddings = ", num_embeddings, "); got values in [", lo,
                    ", ", hi, "]");
}

int64_t check_noise_gradient(const char* op, const char* shape_arg, int64_t expected_dims,
                             const at::Tensor& fitness, const at::Tensor& seeds,
                             at::IntArrayRef shape, double sigma, int64_t pop_size, int64_t offset,
                             bool antithetic) {
  check_seeds(op, seeds);
  TORCH_CHECK_VALUE(static_cast<int64_t>(shape.size()) == expected_dims, op, ": `", shape_arg,
                    "` must have ", expected_dims, expected_dims == 1 ? " dim" : " dims", "; got ", shape);
  int64_t n = 1;
  for (const int64_t s : shape) {
    TORCH_CHECK_VALUE(s >= 0, op, ": `", shape_arg, "` must be non-negative; got ", shape);
    TORCH_CHECK_VALUE(!__builtin_mul_overflow(n, s, &n), op, ": `", shape_arg, "` ", shape,
                      " has more than 2^63 elements");
  }
  TORCH_CHECK_TYPE(at::isFloatingType(fitness.scalar_type()), op,
                   ": `fitness` must be a floating-point tensor; got ", fitness.scalar_type());
  TORCH_CHECK_VALUE(fitness.dim() == 1, op, ": `fitness` must be 1-D (one value per individual); got shape ",
                    fitness.sym_sizes());
  check_same_device(op, "fitness", fitness, "seeds", seeds);
  const c10::SymInt expected_pop = population(seeds, antithetic);
  TORCH_CHECK_VALUE(pop_size == expected_pop, op, ": `pop_size` must equal ",
                    antithetic ? "2 * len(seeds) (antithetic pairs) = " : "len(seeds) = ", expected_pop,
                    "; got ", pop_size);
  TORCH_CHECK_VALUE(fitness.sym_size(0) == pop_size, op, ": `fitness` must have pop_size = ", pop_size,
                    " entries; got ", fitness.sym_size(0));
  check_sigma(op, sigma, /*nonzero=*/true);
  check_offset(op, offset, n);
  return n;
}

c10::SymInt check_reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                            int64_t n_params, int64_t offset, bool antithetic) {
  const char* op = "virtual_noise.reduce_metric";
  check_seeds(op, seeds);
  TORCH_CHECK_TYPE(at::isFloatingType(center.scalar_type()), op,
                   ": `center` must be a floating-point tensor; got ", center.scalar_type());
  TORCH_CHECK_VALUE(center.sym_numel() == n_params, op, ": `n_params` must equal center.numel() = ",
                    center.sym_numel(), "; got ", n_params);
  check_same_device(op, "seeds", seeds, "center", center);
  check_sigma(op, sigma, /*nonzero=*/false);
  check_offset(op, offset, n_params);
  return population(seeds, antithetic);
}

void check_generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset) {
  const char* op = "virtual_noise.generate_noise";
  check_seeds(op, seeds);
  TORCH_CHECK_VALUE(n_elements >= 0, op, ": `n_elements` must be >= 0; got ", n_elements);
  check_offset(op, offset, n_elements);
}

}  // namespace virtual_noise

#include "executor/tensor_parallel.hpp"

#include <map>
#include <optional>

namespace tiermem::exec {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// A column-parallel matmul X . W (W: a PARAM read by it alone) and its bias.
struct Column {
  int matmul = -1;
  int bias = -1;  // its bias_add (-1: none)
  int out = -1;   // the tensor the block reads: the bias_add's output, or the matmul's
};

struct Block {
  enum class Kind { mlp, gated, attention };
  Kind kind = Kind::mlp;
  // mlp: one; gated (SwiGLU): the gate's and the up's; attention: one (q, k
  // and v side by side) or three (q, k, v), all reading the same X.
  std::vector<Column> columns;
  int activation = -1;  // mlp, gated: the element-wise activation
  int mul = -1;         // gated: activation(gate) * up
  int concat = -1;      // attention of three columns: their CONCAT
  int rotary = -1;      // attention: ROTARY (-1: none)
  int attention = -1;   // attention: CAUSAL_ATTENTION
  int row = -1;         // the row-parallel matmul
};

bool is_activation(OpKind k) {
  return k == proto::RELU || k == proto::GELU || k == proto::GELU_EXACT || k == proto::SILU;
}

class Sharder {
 public:
  Sharder(Graph& g, int ways, int index) : m_g(g), m_ways(ways), m_index(index) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      for (int t : g.ops[i].in) m_consumers[t].push_back(static_cast<int>(i));
    }
  }

  Result<std::vector<std::string>> run() {
    std::vector<Block> blocks;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      if (auto b = block_at(static_cast<int>(i))) blocks.push_back(*b);
    }
    if (blocks.empty()) {
      return Status(ErrorCode::invalid_argument,
                    "--tensor-parallel " + std::to_string(m_ways) + ": model '" + m_g.name +
                        "' has no block to split (MATMULs by PARAMs whose outputs reach a second one through a "
                        "bias, an activation, SwiGLU's MUL or a CAUSAL_ATTENTION, used nowhere else)");
    }
    std::vector<std::string> report;
    for (const Block& b : blocks) {
      auto line = shard(b);
      if (!line.ok()) return line.status();
      report.push_back(*line);
    }
    rebuild(blocks);
    return report;
  }

 private:
  // The single op reading `t` (-1: none or several).
  int only_consumer(int t) const {
    auto it = m_consumers.find(t);
    return it != m_consumers.end() && it->second.size() == 1 ? it->second[0] : -1;
  }
  bool is_param_matrix(int t) const {
    return m_g.tensors[t].role == Role::param && m_g.tensors[t].shape.size() == 2;
  }
  int producer(int t) const { return m_g.tensors[t].producer; }
  Status refuse(const std::string& why) const {
    return Status(ErrorCode::invalid_argument, "--tensor-parallel " + std::to_string(m_ways) + ": " + why);
  }

  // The column matmul (and bias) that makes `t`, read by `reader` alone. Every
  // parameter cut is read by its op alone (a weight shared with another op,
  // tied, stays whole: the block is not split).
  std::optional<Column> column_making(int t, int reader) const {
    if (t < 0 || only_consumer(t) != reader) return std::nullopt;
    Column c;
    c.out = t;
    int op = producer(t);
    if (op >= 0 && m_g.ops[op].kind == proto::BIAS_ADD) {
      const Op& bias = m_g.ops[op];
      if (m_g.tensors[bias.in[1]].role != Role::param || only_consumer(bias.in[1]) != op ||
          only_consumer(bias.in[0]) != op) {
        return std::nullopt;
      }
      c.bias = op;
      op = producer(bias.in[0]);
    }
    if (op < 0 || m_g.ops[op].kind != proto::MATMUL || !is_param_matrix(m_g.ops[op].in[1]) ||
        only_consumer(m_g.ops[op].in[1]) != op) {
      return std::nullopt;
    }
    c.matmul = op;
    return c;
  }
  // The row matmul reading `t` alone, by a PARAM read by it alone (-1: none).
  int row_reading(int t) const {
    const int row = only_consumer(t);
    if (row < 0 || m_g.ops[row].kind != proto::MATMUL || m_g.ops[row].in[0] != t || !is_param_matrix(m_g.ops[row].in[1]) ||
        only_consumer(m_g.ops[row].in[1]) != row) {
      return -1;
    }
    return row;
  }
  bool same_input(const std::vector<Column>& cs) const {
    for (const Column& c : cs) {
      if (m_g.ops[c.matmul].in[0] != m_g.ops[cs[0].matmul].in[0]) return false;
    }
    return true;
  }

  std::optional<Block> block_at(int i) const {
    const Op& op = m_g.ops[i];
    Block b;
    if (op.kind == proto::CAUSAL_ATTENTION) {
      b.kind = Block::Kind::attention;
      b.attention = i;
      int in = op.in[0], reader = i;
      if (producer(in) >= 0 && m_g.ops[producer(in)].kind == proto::ROTARY && only_consumer(in) == i) {
        b.rotary = producer(in);
        reader = b.rotary;
        in = m_g.ops[b.rotary].in[0];
      }
      if (producer(in) >= 0 && m_g.ops[producer(in)].kind == proto::CONCAT && only_consumer(in) == reader &&
          m_g.ops[producer(in)].in.size() == 3) {
        b.concat = producer(in);
        for (int part : m_g.ops[b.concat].in) {
          auto c = column_making(part, b.concat);
          if (!c) return std::nullopt;
          b.columns.push_back(*c);
        }
      } else {
        auto c = column_making(in, reader);
        if (!c) return std::nullopt;
        b.columns.push_back(*c);
      }
      b.row = row_reading(op.out[0]);
    } else if (op.kind == proto::MUL) {
      // SwiGLU: activation(X . Wgate) * (X . Wup)
      b.kind = Block::Kind::gated;
      b.mul = i;
      for (int k = 0; k < 2 && b.activation < 0; ++k) {
        const int a = producer(op.in[k]);
        if (a < 0 || !is_activation(m_g.ops[a].kind) || only_consumer(op.in[k]) != i) continue;
        auto gate = column_making(m_g.ops[a].in[0], a);
        auto up = column_making(op.in[1 - k], i);
        if (!gate || !up) continue;
        b.activation = a;
        b.columns = {*gate, *up};
      }
      if (b.activation < 0) return std::nullopt;
      b.row = row_reading(op.out[0]);
    } else if (is_activation(op.kind)) {
      b.activation = i;
      auto c = column_making(op.in[0], i);
      if (!c) return std::nullopt;
      b.columns.push_back(*c);
      b.row = row_reading(op.out[0]);
    } else {
      return std::nullopt;
    }
    if (b.row < 0 || !same_input(b.columns)) return std::nullopt;
    return b;
  }

  void resize_columns(int t, int64_t cols) { m_g.tensors[t].shape.back() = cols; }

  // A parameter cut to `shape`, starting as rows from `row` and `columns`
  // of what it was.
  void cut(int t, std::vector<int64_t> shape, int64_t row, const Ranges& columns) {
    Tensor& p = m_g.tensors[t];
    const Tensor whole = p;
    p.shape = std::move(shape);
    init_as_part_of(whole, row, columns, &p);
  }

  // Column `c` keeps `columns` (of its matmul's output) on this rank.
  void cut_column(const Column& c, const Ranges& columns) {
    int64_t width = 0;
    for (const auto& [first, count] : columns) width += count;
    const Op& mm = m_g.ops[c.matmul];
    cut(mm.in[1], {m_g.tensors[mm.in[1]].shape[0], width}, 0, columns);
    resize_columns(mm.out[0], width);
    if (c.bias >= 0) {
      const Op& bias = m_g.ops[c.bias];
      cut(bias.in[1], {width}, 0, columns);
      resize_columns(bias.out[0], width);
    }
  }

  Result<std::string> shard(const Block& b) {
    const Op& row = m_g.ops[b.row];
    const int64_t t = m_index, T = m_ways;
    const std::string& first = m_g.ops[b.columns[0].matmul].name;
    int64_t rows = 0;  // of W2 this rank keeps
    std::string what;
    if (b.kind == Block::Kind::attention) {
      Op& att = m_g.ops[b.attention];
      const int64_t heads = att.heads, kv = att.kv_heads == 0 ? att.heads : att.kv_heads;
      if (heads % T != 0) {
        return refuse("op '" + att.name + "' has " + std::to_string(heads) + " heads, which " + std::to_string(T) +
                      " ranks cannot share");
      }
      if (kv % T != 0) {
        return refuse("op '" + att.name + "' has " + std::to_string(kv) + " key/value heads, which " +
                      std::to_string(T) + " ranks cannot share");
      }
      const int64_t dh = m_g.tensors[att.out[0]].shape[1] / heads;
      const int64_t q = heads / T * dh, k = kv / T * dh;  // this rank's query and key (value) columns
      if (b.columns.size() == 1) {
        cut_column(b.columns[0], {{t * q, q}, {heads * dh + t * k, k}, {(heads + kv) * dh + t * k, k}});
      } else {
        cut_column(b.columns[0], {{t * q, q}});
        cut_column(b.columns[1], {{t * k, k}});
        cut_column(b.columns[2], {{t * k, k}});
        resize_columns(m_g.ops[b.concat].out[0], q + 2 * k);
      }
      for (int op : {b.rotary, b.attention}) {
        if (op < 0) continue;
        Op& o = m_g.ops[op];
        o.heads /= T;
        if (o.kv_heads != 0) o.kv_heads /= T;
      }
      if (b.rotary >= 0) resize_columns(m_g.ops[b.rotary].out[0], q + 2 * k);
      resize_columns(att.out[0], q);
      m_g.tensors[att.out[1]].shape[0] /= T;  // the softmax of this rank's heads
      rows = q;
      what = "by heads: " + std::to_string(heads / T) + " of " + std::to_string(heads) + " per rank";
      if (kv != heads) what += " (" + std::to_string(kv / T) + " of " + std::to_string(kv) + " key/value heads)";
    } else {
      const Op& mm = m_g.ops[b.columns[0].matmul];
      const int64_t n = m_g.tensors[mm.out[0]].shape[1];
      if (n % T != 0) {
        return refuse("op '" + mm.name + "' has " + std::to_string(n) + " columns, which " + std::to_string(T) +
                      " ranks cannot share");
      }
      rows = n / T;
      for (const Column& c : b.columns) cut_column(c, {{t * rows, rows}});
      resize_columns(m_g.ops[b.activation].out[0], rows);
      if (b.mul >= 0) resize_columns(m_g.ops[b.mul].out[0], rows);
      what = "by columns: " + std::to_string(rows) + " of " + std::to_string(n) + " per rank";
    }
    const int64_t k2 = m_g.tensors[row.in[1]].shape[1];
    cut(row.in[1], {rows, k2}, t * rows, {{0, k2}});
    return "'" + first + "' -> '" + row.name + "' split " + what;
  }

  int add_tensor(const Tensor& like, const std::string& name) {
    Tensor t = like;
    t.name = name;
    t.role = Role::activation;
    t.producer = -1;
    t.grad = -1;
    m_g.tensors.push_back(std::move(t));
    return static_cast<int>(m_g.tensors.size()) - 1;
  }

  // The ops again, with a tp_identity before each block (its columns all
  // read its output) and a tp_all_reduce after its row matmul.
  void rebuild(const std::vector<Block>& blocks) {
    std::map<int, int> column_of, after;  // op -> block
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (const Column& c : blocks[i].columns) column_of[c.matmul] = static_cast<int>(i);
      after[blocks[i].row] = static_cast<int>(i);
    }
    std::map<int, int> identity;  // block -> the tp_identity's output
    std::vector<Op> ops;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      Op op = m_g.ops[i];
      if (auto it = column_of.find(static_cast<int>(i)); it != column_of.end()) {
        if (identity.count(it->second) == 0) {
          Op in;
          in.name = op.name + ".tp_in";
          in.kind = proto::TP_IDENTITY;
          in.in = {op.in[0]};
          in.out = {add_tensor(m_g.tensors[op.in[0]], op.name + ".tp_in")};
          in.accumulate = {false};
          identity[it->second] = in.out[0];
          ops.push_back(std::move(in));
        }
        op.in[0] = identity[it->second];
      }
      if (after.count(static_cast<int>(i)) != 0) {
        Op sum;
        sum.name = op.name + ".tp_sum";
        sum.kind = proto::TP_ALL_REDUCE;
        sum.out = {op.out[0]};
        sum.accumulate = {false};
        op.out[0] = add_tensor(m_g.tensors[op.out[0]], op.name + ".partial");
        sum.in = {op.out[0]};
        ops.push_back(std::move(op));
        ops.push_back(std::move(sum));
        continue;
      }
      ops.push_back(std::move(op));
    }
    m_g.ops = std::move(ops);
    for (Tensor& t : m_g.tensors) t.producer = -1;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      for (int t : m_g.ops[i].out) {
        if (m_g.tensors[t].producer < 0) m_g.tensors[t].producer = static_cast<int>(i);
      }
    }
  }

  Graph& m_g;
  int m_ways, m_index;
  std::map<int, std::vector<int>> m_consumers;
};

}  // namespace

Result<std::vector<std::string>> shard_for_tensor_parallel(Graph& forward, int ways, int index) {
  if (ways <= 1) return std::vector<std::string>{};
  if (!forward.ops_of(Phase::backward).empty()) {
    return Status(ErrorCode::failed_precondition, "tensor parallelism splits the forward graph, before autodiff");
  }
  return Sharder(forward, ways, index).run();
}

}  // namespace tiermem::exec

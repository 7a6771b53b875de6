#include "causeway/scheduler/executable.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "causeway/base/seconds.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/kernels/ops.h"

namespace causeway {

size_t RunState::step_count() const { return executable_->gang_calls(); }

bool RunCompletion::dispatched() const {
  absl::MutexLock lock(&mu_);
  return dispatched_;
}

std::vector<Future<>> RunCompletion::futures() const {
  absl::MutexLock lock(&mu_);
  return futures_;
}

void RunCompletion::AddFutures(const std::vector<Future<>>& futures, int gang_call) {
  absl::MutexLock lock(&mu_);
  futures_.insert(futures_.end(), futures.begin(), futures.end());
  gang_calls_.insert(gang_calls_.end(), futures.size(), gang_call);
}

void RunCompletion::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  dispatched_ = true;
  error_ = std::move(status);
}

void RunCompletion::Stop(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (stopped_.ok()) stopped_ = std::move(status);
}

absl::Status RunCompletion::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

bool RunCompletion::done() const {
  absl::MutexLock lock(&mu_);
  if (!dispatched_) return false;
  for (const Future<>& f : futures_) {
    if (!f.IsReady()) return false;
  }
  return true;
}

std::pair<Future<>, int> RunCompletion::FirstPending() const {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < futures_.size(); ++i) {
    if (!futures_[i].IsReady()) return {futures_[i], gang_calls_[i]};
  }
  return {Future<>(), -1};
}

void RunCompletion::AwaitWork() const {
  std::vector<Future<>> futures;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&dispatched_));
    futures = futures_;
  }
  for (auto it = futures.rbegin(); it != futures.rend(); ++it) (void)it->AwaitStatus();
}

absl::Status RunCompletion::Await(absl::Time deadline) const {
  // The run's own deadline ends the wait too: the deadline watch then stops
  // the run, naming what had not finished.
  const absl::Time until = std::min(deadline, deadline_);
  // Past the run's own deadline: the watch's verdict, unless the run has
  // ended meanwhile (its accelerator quarantined first, say: the watch then
  // leaves it be), when its own results stand. Neither tells this thread,
  // so it looks every few milliseconds, for as long as that takes.
  auto stop_status = [this, deadline]() -> absl::Status {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !stopped_.ok(); };
        if (mu_.AwaitWithDeadline(absl::Condition(&stopped),
                                  std::min(deadline, absl::Now() + absl::Milliseconds(5)))) {
          return stopped_;
        }
        if (absl::Now() >= deadline) return absl::DeadlineExceededError("run not finished at the deadline");
        if (!dispatched_) continue;
        if (!error_.ok()) return error_;
      }
      if (!done()) continue;
      // Ended: the first error in dispatch order.
      for (const Future<>& f : futures()) {
        if (absl::Status s = f.AwaitStatus(); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
  };
  std::vector<Future<>> futures;
  bool past_own_deadline = false;
  {
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dispatched_ || !stopped_.ok(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&settled), until)) {
      if (until >= deadline) return absl::DeadlineExceededError("run not yet dispatched at the deadline");
      past_own_deadline = true;
    } else {
      if (!stopped_.ok()) return stopped_;
      if (!error_.ok()) return error_;
      futures = futures_;
    }
  }
  if (past_own_deadline) return stop_status();
  // The last futures first: awaiting them retires the earlier ones on the
  // same accelerators in one go. In slices: a Stop (a cancel) does not wake
  // a device wait.
  std::vector<absl::Status> statuses(futures.size());
  for (size_t i = futures.size(); i-- > 0;) {
    while (true) {
      const absl::Time slice = std::min(until, absl::Now() + kStopPoll);
      absl::Status waited = futures[i].AwaitStatus(slice);
      if (futures[i].IsReady()) {
        statuses[i] = futures[i].AwaitStatus();
        break;
      }
      if (absl::Status s = stopped(); !s.ok()) return s;
      if (slice >= until) return until < deadline ? stop_status() : waited;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_.ok()) return stopped_;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

Executable::Executable(std::shared_ptr<const Program> program, ClientId client, int instances,
                       std::string client_name)
    : program_(std::move(program)), client_(client), max_instances_(std::max(1, instances)) {
  // One submission per device for each run of steps on the same mesh: on
  // lavapipe a submission costs ten times a dispatch inside a list. A step
  // that waits on other devices (a collective phase) begins a new one.
  const auto& steps = program_->steps();
  for (size_t s = 0; s < steps.size(); ++s) {
    if (!groups_.empty() && steps[groups_.back().first].mesh == steps[s].mesh && !steps[s].waits_on_peers()) {
      groups_.back().second = s + 1;
    } else {
      groups_.emplace_back(s, s + 1);
    }
  }
  // Inputs produced outside each gang call: its submissions wait for them.
  for (const auto& [first, last] : groups_) {
    std::vector<int> external, inside;
    for (size_t s = first; s < last; ++s) {
      // A transfer waits for the source devices it reads (DispatchStep).
      if (steps[s].kind == ProgramStep::kTransfer) {
        inside.insert(inside.end(), steps[s].outputs.begin(), steps[s].outputs.end());
        continue;
      }
      for (int v : steps[s].inputs) {
        if (std::find(inside.begin(), inside.end(), v) == inside.end() &&
            std::find(external.begin(), external.end(), v) == external.end()) {
          external.push_back(v);
        }
      }
      inside.insert(inside.end(), steps[s].outputs.begin(), steps[s].outputs.end());
    }
    external_inputs_.push_back(std::move(external));
  }
  by_engine_.resize(steps.size());
  for (const auto& [first, last] : groups_) {
    for (size_t s = first; s < last; ++s) {
      if (steps[s].kind != ProgramStep::kTransfer || ProducedIn(first, s, steps[s].inputs[0])) continue;
      const Mesh& mesh = *steps[s].mesh;
      by_engine_[s].resize(mesh.size());
      for (int d = 0; d < mesh.size(); ++d) {
        uint64_t bytes = 0;
        for (const TransferPlan::Piece& piece : steps[s].transfer->pieces[d]) {
          for (const CommandList::CopyRegion& r : piece.regions) bytes += r.size;
        }
        by_engine_[s][d] = bytes > 0 && mesh.device(d) != nullptr && mesh.device(d)->UsesCopyEngine(bytes);
      }
    }
  }
  costs_ = std::make_shared<GangCallCosts>(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    submit_what_.push_back(client_name.empty()
                               ? DescribeGangCall(g)
                               : absl::StrCat(DescribeGangCall(g), " for client '", client_name, "'"));
  }
}

Array::Contents Executable::OutputContents(int v) const {
  for (const ProgramStep& step : program_->steps()) {
    if (step.kind == ProgramStep::kReceive && step.outputs[0] == v) return Array::Contents::kWrittenWhole;
  }
  return Array::Contents::kZeros;
}

bool Executable::ProducedIn(size_t first, size_t s, int v) const {
  const auto& steps = program_->steps();
  for (size_t e = first; e < s; ++e) {
    if (std::find(steps[e].outputs.begin(), steps[e].outputs.end(), v) != steps[e].outputs.end()) return true;
  }
  return false;
}

bool Executable::ByEngine(size_t s, int d) const {
  return d < static_cast<int>(by_engine_[s].size()) && by_engine_[s][d];
}

std::string Executable::GangCallName(size_t g) const {
  std::string name;
  for (size_t s = groups_[g].first; s < groups_[g].second; ++s) {
    if (!name.empty()) name += "+";
    name += program_->steps()[s].node;
  }
  return name;
}

std::string Executable::DescribeGangCall(size_t g) const {
  std::vector<std::string> kernels;
  for (size_t s = groups_[g].first; s < groups_[g].second; ++s) {
    const ProgramStep& step = program_->steps()[s];
    if (step.kind != ProgramStep::kCall) continue;
    for (const KernelStep& k : step.function->steps()) {
      std::string name = absl::StrCat("'", k.kernel->name(), "'");
      if (std::find(kernels.begin(), kernels.end(), name) == kernels.end())
        kernels.push_back(std::move(name));
    }
  }
  return absl::StrCat("gang call '", GangCallName(g), "'",
                      kernels.empty() ? ""
                                      : absl::StrCat(" (kernel", kernels.size() > 1 ? "s " : " ",
                                                     absl::StrJoin(kernels, ", "), ")"),
                      " of program '", program_->name(), "'");
}

absl::Status Executable::RecordGangCall(CommandList& list, const std::vector<ArrayRef>& values, const Instance& inst,
                                        size_t g, int d) const {
  for (size_t s = groups_[g].first; s < groups_[g].second; ++s)
    CAUSEWAY_RETURN_IF_ERROR(RecordStep(list, values, inst, s, d));
  return absl::OkStatus();
}

Executable::~Executable() = default;

bool Executable::StepIsStatic(size_t s) const {
  const ProgramStep& step = program_->steps()[s];
  for (const auto* ids : {&step.inputs, &step.outputs}) {
    for (int v : *ids) {
      if (program_->values()[v].kind != ProgramValue::kIntermediate) return false;
    }
  }
  return true;
}

absl::StatusOr<std::vector<BufferArg>> Executable::StepBuffers(const std::vector<ArrayRef>& values,
                                                               const Instance& inst, size_t s, int d) const {
  const ProgramStep& step = program_->steps()[s];
  std::vector<BufferArg> buffers;
  for (const auto* ids : {&step.inputs, &step.outputs}) {
    for (int v : *ids) {
      CAUSEWAY_ASSIGN_OR_RETURN(auto b, values[v]->shard(d));
      buffers.emplace_back(std::move(b));
    }
  }
  for (const auto& b : inst.scratch[s][d]) buffers.emplace_back(b);
  return buffers;
}

absl::Status Executable::RecordCollective(CommandList& list, const std::vector<ArrayRef>& values,
                                          const Instance& inst, size_t s, int d) const {
  const ProgramStep& step = program_->steps()[s];
  const CollectivePlan& plan = *step.collective;
  const uint64_t elem = DTypeSize(plan.dtype);
  auto buffer = [&](CollectiveOp::Buffer b, int device) -> absl::StatusOr<std::shared_ptr<Buffer>> {
    switch (b) {
      case CollectiveOp::kIn:
        return values[step.inputs[0]]->shard(device);
      case CollectiveOp::kOut:
        return values[step.outputs[0]]->shard(device);
      case CollectiveOp::kWork:
        return inst.scratch[s][device][0];
      case CollectiveOp::kRecv:
        return inst.scratch[s][device][1];
    }
    return absl::InternalError("unknown collective buffer");
  };
  const CollectiveGroups& groups = *step.groups;
  for (const CollectiveOp& op : plan.phases[step.phase].ops[groups.position[d]]) {
    if (op.elements == 0) continue;
    CAUSEWAY_ASSIGN_OR_RETURN(auto dst, buffer(op.dst, d));
    switch (op.kind) {
      case CollectiveOp::kCopy: {
        CAUSEWAY_ASSIGN_OR_RETURN(auto src, buffer(op.src, groups.Peer(d, op.src_device)));
        CAUSEWAY_RETURN_IF_ERROR(list.Copy(BufferArg(src, op.src_offset * elem, op.elements * elem),
                                           BufferArg(dst, op.dst_offset * elem, op.elements * elem)));
        break;
      }
      case CollectiveOp::kZero:
        CAUSEWAY_RETURN_IF_ERROR(list.Fill(BufferArg(dst), 0));
        break;
      case CollectiveOp::kCombine: {
        CAUSEWAY_ASSIGN_OR_RETURN(auto a, buffer(op.a, d));
        CAUSEWAY_ASSIGN_OR_RETURN(auto b, buffer(op.src, d));
        CAUSEWAY_RETURN_IF_ERROR(ops::Combine(list, plan.options.op == ReduceOp::kMax,
                                              plan.dtype == DType::kI32, {a, op.a_offset}, {b, op.src_offset},
                                              {dst, op.dst_offset}, op.elements));
        break;
      }
      case CollectiveOp::kReduce: {
        // Every position's buffer, read where it lives (the list binds a
        // peer's through this device's import of its memory).
        std::vector<ops::ElementRef> operands;
        for (int pos = 0; pos < groups.size(); ++pos) {
          CAUSEWAY_ASSIGN_OR_RETURN(auto src, buffer(op.src, groups.Peer(d, pos)));
          operands.push_back({std::move(src), op.src_offset});
        }
        CAUSEWAY_RETURN_IF_ERROR(ops::CombineN(list, plan.options.op == ReduceOp::kMax,
                                               plan.dtype == DType::kI32, operands, {dst, op.dst_offset},
                                               op.elements));
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Executable::RecordStep(CommandList& list, const std::vector<ArrayRef>& values, const Instance& inst,
                                    size_t s, int d) const {
  const ProgramStep& step = program_->steps()[s];
  if (step.kind == ProgramStep::kCollective) return RecordCollective(list, values, inst, s, d);
  // A shard the host can read and write directly (device memory on lavapipe
  // and unified-memory GPUs) is sent from and received into as it is; others
  // go through host-visible staging.
  if (step.kind == ProgramStep::kSend) {
    if (inst.scratch[s][d].empty()) return absl::OkStatus();  // another device sends this shard
    CAUSEWAY_ASSIGN_OR_RETURN(auto src, values[step.inputs[0]]->shard(d));
    if (src->host_coherent()) return absl::OkStatus();
    return list.Copy(BufferArg(src), BufferArg(inst.scratch[s][d][0]));
  }
  if (step.kind == ProgramStep::kReceive) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto dst, values[step.outputs[0]]->shard(d));
    if (dst->host_coherent()) return absl::OkStatus();
    return list.Copy(BufferArg(inst.scratch[s][d][0]), BufferArg(dst));
  }
  if (step.kind == ProgramStep::kTransfer) {
    if (ByEngine(s, d)) return absl::OkStatus();  // moved before the gang call (DispatchStep)
    // Device d of the target mesh; the source mesh may be smaller.
    CAUSEWAY_ASSIGN_OR_RETURN(auto dst, values[step.outputs[0]]->shard(d));
    for (const TransferPlan::Piece& piece : step.transfer->pieces[d]) {
      CAUSEWAY_ASSIGN_OR_RETURN(auto src, values[step.inputs[0]]->shard(piece.source));
      CAUSEWAY_RETURN_IF_ERROR(list.CopyRegions(src, dst, piece.regions));
    }
    return absl::OkStatus();
  }
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<BufferArg> buffers, StepBuffers(values, inst, s, d));
  return step.function->Record(list, buffers);
}

absl::StatusOr<std::shared_ptr<Executable::Instance>> Executable::MakeInstance() {
  auto inst = std::make_shared<Instance>();
  const auto& values = program_->values();
  inst->values.resize(values.size());
  for (size_t v = 0; v < values.size(); ++v) {
    const ProgramValue& pv = values[v];
    if (pv.kind != ProgramValue::kIntermediate) continue;
    CAUSEWAY_ASSIGN_OR_RETURN(inst->values[v],
                              Array::Create(pv.mesh, pv.shape, pv.dtype, pv.sharding, client_,
                                            absl::StrCat(program_->name(), ":", pv.name)));
    inst->bytes += inst->values[v]->bytes();
  }
  const auto& steps = program_->steps();
  inst->scratch.resize(steps.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    const ProgramStep& step = steps[s];
    inst->scratch[s].resize(step.mesh->size());
    if (step.kind == ProgramStep::kCollective) {
      // One set per collective, shared by its phases: work, then recv.
      if (step.phase > 0) {
        inst->scratch[s] = inst->scratch[s - 1];
        continue;
      }
      const uint64_t elem = DTypeSize(step.collective->dtype);
      for (int d = 0; d < step.mesh->size(); ++d) {
        for (uint64_t elements : {step.collective->work_elements, step.collective->recv_elements}) {
          CAUSEWAY_ASSIGN_OR_RETURN(
              auto b, step.mesh->device(d)->CreateBuffer(std::max<uint64_t>(elements * elem, 4)));
          inst->bytes += b->reserved_size();
          inst->scratch[s][d].push_back(std::move(b));
        }
      }
      continue;
    }
    if (step.kind == ProgramStep::kSend || step.kind == ProgramStep::kReceive) {
      const ProgramValue& pv = values[step.kind == ProgramStep::kSend ? step.inputs[0] : step.outputs[0]];
      CAUSEWAY_ASSIGN_OR_RETURN(Shape shard, ShardShape(pv.shape, pv.sharding, *step.mesh));
      const uint64_t bytes = static_cast<uint64_t>(NumElements(shard)) * DTypeSize(pv.dtype);
      std::vector<bool> sent(step.mesh->size(), false);
      for (int d = 0; d < step.mesh->size(); ++d) {
        if (step.kind == ProgramStep::kSend) {
          // One device per distinct shard sends it.
          const int piece = pv.sharding.replicated() ? 0 : step.mesh->Coordinate(d, pv.sharding.mesh_axis);
          if (sent[piece]) continue;
          sent[piece] = true;
        }
        CAUSEWAY_ASSIGN_OR_RETURN(
            auto b, step.mesh->device(d)->CreateStagingBuffer(bytes, step.kind == ProgramStep::kSend));
        inst->scratch[s][d].push_back(std::move(b));
      }
      continue;
    }
    if (step.kind != ProgramStep::kCall) continue;
    for (int d = 0; d < step.mesh->size(); ++d) {
      for (const TensorSpec& t : step.function->scratch()) {
        CAUSEWAY_ASSIGN_OR_RETURN(auto b,
                                  step.mesh->device(d)->CreateBuffer(std::max<uint64_t>(t.bytes(), 4)));
        inst->bytes += b->reserved_size();
        inst->scratch[s][d].push_back(std::move(b));
      }
    }
  }
  inst->lists.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Mesh& mesh = GangCallMesh(g);
    inst->lists[g].resize(mesh.size());
    bool is_static = true;
    for (size_t s = groups_[g].first; s < groups_[g].second; ++s) is_static &= StepIsStatic(s);
    if (!is_static) continue;
    for (int d = 0; d < mesh.size(); ++d) {
      CAUSEWAY_ASSIGN_OR_RETURN(
          auto list, mesh.device(d)->CreateCommandList(absl::StrCat(program_->name(), ":", GangCallName(g))));
      CAUSEWAY_RETURN_IF_ERROR(RecordGangCall(*list, inst->values, *inst, g, d));
      inst->lists[g][d] = std::move(list);
    }
  }
  return inst;
}

absl::StatusOr<std::shared_ptr<RunState>> Executable::Prepare(const std::vector<ArrayRef>& inputs,
                                                              std::vector<ArrayRef>* outputs, uint64_t tag,
                                                              absl::Duration deadline) {
  const absl::Time started = absl::Now();
  if (deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("program '", program_->name(),
                                                   "': a run's deadline must be positive, got ",
                                                   absl::FormatDuration(deadline)));
  }
  const auto& params = program_->parameters();
  if (inputs.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("program '", program_->name(), "' takes ", params.size(),
                                                   " inputs, given ", inputs.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ProgramValue& p = program_->values()[params[i]];
    const ArrayRef& a = inputs[i];
    std::string what = absl::StrCat("program '", program_->name(), "' parameter '", p.name, "'");
    if (a == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": no array"));
    if (a->released()) return absl::FailedPreconditionError(absl::StrCat(what, ": array '", a->label(),
                                                                         "' was released"));
    if (a->owner() != client_) {
      return absl::PermissionDeniedError(absl::StrCat(what, ": array '", a->label(), "' belongs to another client"));
    }
    if (a->shape() != p.shape || a->dtype() != p.dtype || a->mesh() != p.mesh || !(a->sharding() == p.sharding)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " wants ", DTypeName(p.dtype), ShapeString(p.shape), " ", p.sharding.ToString(), " on ",
          p.mesh->DebugString(), ", got ", DTypeName(a->dtype()), ShapeString(a->shape()), " ",
          a->sharding().ToString(), " on ", a->mesh()->DebugString()));
    }
  }
  for (const ProgramStep& s : program_->steps()) {
    if (s.mesh->released()) {
      return absl::FailedPreconditionError(absl::StrCat("program '", program_->name(), "' node '", s.node, "': ",
                                                        s.mesh->DebugString(), " was released"));
    }
  }
  for (int v : params) {
    const ProgramValue& p = program_->values()[v];
    if (p.mesh->released()) {
      return absl::FailedPreconditionError(absl::StrCat("program '", program_->name(), "' parameter '", p.name,
                                                        "': ", p.mesh->DebugString(), " was released"));
    }
  }

  // Take an instance: a new one while there may be more, else the least
  // recently used, once its previous run has ended.
  std::shared_ptr<Instance> inst;
  std::shared_ptr<RunCompletion> previous;
  {
    absl::MutexLock lock(&mu_);
    if (released_) return absl::FailedPreconditionError("the executable was released (its client closed)");
    if (static_cast<int>(instances_.size()) < max_instances_) {
      CAUSEWAY_ASSIGN_OR_RETURN(inst, MakeInstance());
      instances_.push_back(inst);
    } else {
      inst = instances_[0];
      for (const auto& i : instances_) {
        if (i->last_used < inst->last_used) inst = i;
      }
    }
    previous = inst->last_run;
    inst->last_used = ++clock_;
    ++runs_;
    if (tag == 0) tag = runs_;
  }
  if (previous != nullptr) {
    HostSpan span("run-backpressure");
    // Every piece of its work, even past its deadline: this run reuses its buffers.
    previous->AwaitWork();  // its errors are its own run's
  }
  {
    absl::MutexLock lock(&mu_);
    if (released_) return absl::FailedPreconditionError("the executable was released (its client closed) while the run waited");
  }

  auto run = std::make_shared<RunState>();
  run->step_futures_.resize(program_->steps().size());
  run->executable_ = shared_from_this();
  run->client_ = client_;
  run->tag_ = tag;
  run->deadline_ = deadline;
  run->started_ = started;
  run->completion_->set_deadline(started + deadline);
  run->instance_ = inst;
  run->values_ = inst->values;
  for (size_t i = 0; i < params.size(); ++i) run->values_[params[i]] = inputs[i];
  outputs->clear();
  for (int o : program_->outputs()) {
    const ProgramValue& pv = program_->values()[o];
    CAUSEWAY_ASSIGN_OR_RETURN(run->values_[o], Array::Create(pv.mesh, pv.shape, pv.dtype, pv.sharding,
                                                             client_, pv.name, OutputContents(o)));
    outputs->push_back(run->values_[o]);
  }
  for (const ProgramStep& s : program_->steps()) {
    for (int v : s.outputs) run->values_[v]->BeginWrite();
  }
  {
    absl::MutexLock lock(&mu_);
    inst->last_run = run->completion_;
  }
  ExpectArrivals(*run);
  return run;
}

void Executable::ExpectArrivals(RunState& run) const {
  const auto& steps = program_->steps();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ProgramStep& head = steps[groups_[g].first];
    if (head.kind != ProgramStep::kReceive) continue;
    if (run.arrivals_.empty()) run.arrivals_.resize(groups_.size());
    const Mesh& mesh = GangCallMesh(g);
    const Array& value = *run.values_[head.outputs[0]];
    std::vector<Channel::Target> targets;
    absl::Status status;
    for (int d = 0; d < mesh.size() && status.ok(); ++d) {
      absl::StatusOr<std::shared_ptr<Buffer>> shard = value.shard(d);
      if (!shard.ok()) {
        status = shard.status();
        break;
      }
      targets.push_back(
          {static_cast<uint64_t>(value.ShardIndex(d)) * value.shard_bytes(),
           (*shard)->host_coherent() ? *shard : run.instance_->scratch[groups_[g].first][d][0]});
    }
    run.arrivals_[g] =
        status.ok()
            ? head.channel->Receive(run.tag_, value.shard_bytes() * value.shard_count(), std::move(targets))
            : Future<>::Ready(status);
  }
}

Future<> Executable::Arrival(const RunState& run, size_t g) const {
  if (g >= run.arrivals_.size()) return Future<>();
  return run.arrivals_[g];
}

absl::StatusOr<std::vector<Future<>>> Executable::DispatchStep(RunState& run, size_t g,
                                                               const std::function<void(int64_t)>& on_device_time,
                                                               std::vector<int>* commands) {
  {
    absl::MutexLock lock(&mu_);
    if (released_) return absl::FailedPreconditionError("the executable was released (its client closed)");
  }
  Instance* inst = run.instance_.get();
  const auto [first, last] = groups_[g];
  const Mesh& mesh = GangCallMesh(g);
  const auto& steps = program_->steps();
  const std::vector<int>& external = external_inputs_[g];
  std::vector<Future<>> futures;
  const ProgramStep& head = steps[first];
  // A receive: every device waits until the channel has filled its staging
  // (by now it has, when the scheduler waited for Arrival).
  Future<> arrived = Arrival(run, g);
  std::vector<Future<>> sends;
  for (int d = 0; d < mesh.size(); ++d) {
    Accelerator* acc = mesh.device(d);
    std::shared_ptr<CommandList> list = inst->lists[g][d];
    if (list == nullptr) {
      CAUSEWAY_ASSIGN_OR_RETURN(list,
                                acc->CreateCommandList(absl::StrCat(program_->name(), ":", GangCallName(g))));
      CAUSEWAY_RETURN_IF_ERROR(RecordGangCall(*list, run.values_, *inst, g, d));
    }
    absl::InlinedVector<Future<>, 4> waits;
    for (int v : external) waits.push_back(run.values_[v]->ShardReady(d));
    for (size_t s = first; s < last; ++s) {
      if (steps[s].kind != ProgramStep::kTransfer) continue;
      // A transfer produced inside this gang call reads a shard this device
      // writes first (in order); others wait for each source they read, or
      // for the copy engine that moves the bytes once those are ready.
      const int v = steps[s].inputs[0];
      if (ProducedIn(first, s, v)) continue;
      std::shared_ptr<Buffer> dst;
      if (ByEngine(s, d)) {
        CAUSEWAY_ASSIGN_OR_RETURN(dst, run.values_[steps[s].outputs[0]]->shard(d));
      }
      for (const TransferPlan::Piece& piece : steps[s].transfer->pieces[d]) {
        Future<> ready = run.values_[v]->ShardReady(piece.source);
        if (dst == nullptr) {
          waits.push_back(std::move(ready));
          continue;
        }
        CAUSEWAY_ASSIGN_OR_RETURN(auto src, run.values_[v]->shard(piece.source));
        waits.push_back(acc->copy_engine()->Copy(std::move(src), dst, piece.regions, {std::move(ready)}));
      }
    }
    if (head.kind == ProgramStep::kReceive) waits.push_back(arrived);
    if (head.kind == ProgramStep::kCollective) {
      // The peers this device reads from: their input (first phase) or
      // their part of the phase before.
      const CollectiveGroups& groups = *head.groups;
      for (int pos : head.collective->phases[head.phase].waits[groups.position[d]]) {
        const int peer = groups.Peer(d, pos);
        waits.push_back(head.phase == 0 ? run.values_[head.inputs[0]]->ShardReady(peer)
                                        : run.step_futures_[first - 1][peer]);
      }
    }
    SubmitOptions submit;
    submit.on_device_time = on_device_time;
    if (const absl::Duration limit = run.deadline_; limit != absl::InfiniteDuration()) {
      // No submission of the run may hold a device longer than the whole run may take.
      submit.hold_limit = limit;
      submit.what = absl::StrCat(submit_what_[g], ", under a deadline of ", FormatSeconds(limit));
    } else {
      submit.what = submit_what_[g];
    }
    // Nothing to run (a send from, or a receive into, memory the host reads
    // and writes directly) and nothing to wait for: no submission. Its
    // outputs are ready now, and so is the call on this device.
    bool idle = list->size() == 0;
    for (const Future<>& w : waits) idle = idle && w.IsReady() && w.AwaitStatus().ok();
    Future<> f;
    if (idle) {
      if (on_device_time) on_device_time(0);
      f = Future<>::Ready(absl::OkStatus());
    } else {
      f = acc->Submit(list, waits, std::move(submit));
    }
    if (commands != nullptr) commands->push_back(static_cast<int>(list->size()));
    for (size_t s = first; s < last; ++s) {
      if (steps[s].kind != ProgramStep::kSend || inst->scratch[s][d].empty()) continue;
      Array& value = *run.values_[steps[s].inputs[0]];
      CAUSEWAY_ASSIGN_OR_RETURN(auto shard, value.shard(d));
      Future<> sent = steps[s].channel->Send(run.tag_, static_cast<uint64_t>(value.ShardIndex(d)) * value.shard_bytes(),
                                             value.shard_bytes() * value.shard_count(),
                                             shard->host_coherent() ? shard : inst->scratch[s][d][0], f);
      // Sent straight from a client's array: its next upload waits for the
      // send. (An intermediate is rewritten only by a later run of its
      // instance, which waits for this run, sends included.)
      if (shard->host_coherent() &&
          program_->values()[steps[s].inputs[0]].kind == ProgramValue::kParameter) {
        value.AddReader(d, sent);
      }
      sends.push_back(std::move(sent));
    }
    for (size_t s = first; s < last; ++s) {
      if (steps[s].kind == ProgramStep::kCall || steps[s].kind == ProgramStep::kReceive ||
          program_->values()[steps[s].inputs[0]].kind != ProgramValue::kParameter) {
        continue;
      }
      // The client's array: its next upload waits for this read.
      if (steps[s].kind == ProgramStep::kSend && !inst->scratch[s][d].empty()) {
        run.values_[steps[s].inputs[0]]->AddReader(d, f);
      }
      if (steps[s].kind == ProgramStep::kTransfer) {
        for (const TransferPlan::Piece& piece : steps[s].transfer->pieces[d]) {
          run.values_[steps[s].inputs[0]]->AddReader(piece.source, f);
        }
      }
      if (steps[s].kind == ProgramStep::kCollective) {
        const CollectiveGroups& groups = *steps[s].groups;
        for (const CollectiveOp& op : steps[s].collective->phases[steps[s].phase].ops[groups.position[d]]) {
          if (op.src != CollectiveOp::kIn) continue;
          if (op.kind == CollectiveOp::kCopy) {
            run.values_[steps[s].inputs[0]]->AddReader(groups.Peer(d, op.src_device), f);
          } else if (op.kind == CollectiveOp::kReduce) {
            for (int pos = 0; pos < groups.size(); ++pos) {
              run.values_[steps[s].inputs[0]]->AddReader(groups.Peer(d, pos), f);
            }
          }
        }
      }
    }
    futures.push_back(std::move(f));
  }
  for (size_t s = first; s < last; ++s) run.step_futures_[s] = futures;
  for (size_t s = first; s < last; ++s) {
    for (int v : steps[s].outputs) run.values_[v]->EndWrite(futures);
  }
  if (!sends.empty()) {
    // The run (and its instance's staging) is done once its sends are.
    run.completion_->AddFutures(sends, -1);
  }
  return futures;
}

void Executable::FinishDispatch(RunState& run, absl::Status status, size_t first_undone) {
  if (!status.ok()) {
    // Values that will never be written must not leave readers waiting.
    size_t first_step = first_undone < groups_.size() ? groups_[first_undone].first : program_->steps().size();
    for (size_t s = first_step; s < program_->steps().size(); ++s) {
      const ProgramStep& step = program_->steps()[s];
      if (step.kind == ProgramStep::kSend && run.instance_ != nullptr) {
        // The receiving island must not wait for what will never come.
        for (const auto& staging : run.instance_->scratch[s]) {
          if (staging.empty()) continue;
          (void)step.channel->Send(run.tag_, 0, staging[0]->size(), staging[0], Future<>::Ready(status));
          break;
        }
      }
      std::vector<Future<>> failed(step.mesh->size(), Future<>::Ready(status));
      for (int v : step.outputs) run.values_[v]->EndWrite(failed);
    }
    // Values asked for and never to be used: bytes still to come are
    // dropped, and the run's buffers are free once no writer holds them.
    for (size_t g = first_undone; g < run.arrivals_.size(); ++g) {
      if (!run.arrivals_[g].valid()) continue;
      program_->steps()[groups_[g].first].channel->Abandon(run.tag_, status);
      run.completion_->AddFutures({run.arrivals_[g]}, static_cast<int>(g));
    }
  }
  // The run no longer needs the instance (in-flight work holds its command
  // lists); the instance keeps only the run's completion.
  run.instance_.reset();
  // Nor its arrays: the client holds the outputs it wants, and in-flight
  // work holds the buffers it uses.
  run.values_.clear();
  run.step_futures_.clear();
  run.completion_->Finish(std::move(status));
}

uint64_t Executable::bytes_held() {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& inst : instances_) total += inst->bytes;
  return total;
}

void Executable::Release() {
  absl::MutexLock lock(&mu_);
  released_ = true;
  for (auto& inst : instances_) {
    for (auto& v : inst->values) {
      if (v != nullptr) v->Release();
    }
  }
  instances_.clear();
}

}  // namespace causeway

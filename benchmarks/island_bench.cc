// Island processes end to end: how fast a value crosses between two island
// servers (DCN), against plain TCP between two processes in the same run;
// and a program over two islands against the same program on one island
// with as many accelerators.
//
//   transfer:  a program whose part on island a sends an f32 array of S bytes
//              (one accelerator, replicated) to island b: one reshard node
//              from a mesh on a to a mesh on b, received straight into the
//              output's device memory where the host can write it (the CPU
//              driver, unified memory), else through staging. Each run
//              sends the next of as many distinct inputs as the TCP baseline
//              has source buffers (64 MiB in all, at least two). Runs are
//              queued back to back, kTransferInFlight + 1 unfinished at
//              most; a sample is the steady-state bytes per second over
//              runs of 512 MiB in all (first run untimed). Baselines
//              (tcp_baseline.h, the same loopback and the same two cores):
//              streamed TCP with as many transfers unanswered and sends of
//              the transport's data chunk size (the ratio's baseline), the
//              one-way ceiling (no answers), and request/reply (each
//              transfer waits for its answer; informative only).
//   program:   a pipeline of matmul stages, two stages on each island's two
//              accelerators (two islands, activations over DCN) against the
//              same program on one island process of four accelerators;
//              programs per second over a stream of runs.
//
// The cases alternate sample by sample; medians of `--samples` are printed,
// and the ratios. Islands are `causeway island` processes on the CPU driver,
// driven through the client API (causeway/client/client.h), or running
// islands given by --connect.
//
//   causeway_island_bench [--sizes=1,4,16,64,256] [--only=transfer|program]
//                         [--connect=A,B[,C]] [--secret-file=FILE] [--samples=9] [--quick] [--json=FILE]
// --quick: 1 sample, 1 MiB, 32 MiB per transfer sample, 4 program runs per
// sample (seconds, for tests); the common flags: bench_main.h. The islands
// are started from the causeway binary this was built with, or
// $CAUSEWAY_CLI (as `causeway bench` sets it); with --connect, the transfer
// runs from A to B and the program over A and B (two accelerators each)
// against C (four), and without C the program table is not run. The
// secret: --secret-file, else $CAUSEWAY_SECRET, else none (loopback).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "benchmarks/tcp_baseline.h"
#include "causeway/base/env.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/island_process.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/connection.h"

namespace causeway::bench {
namespace {

using client::Array;
using client::Client;
using client::LoadedProgram;
using client::Mesh;
using transport::IslandProcess;

// --- islands ---

uint64_t transfer_sample_bytes = uint64_t{512} << 20;  // at least this much a transfer sample (--quick: 32 MiB)
int program_runs = 24;                                 // runs a program sample (--quick: 4)

// Where the tables run: islands started here, or the running ones of
// --connect.
struct Islands {
  std::vector<std::string> connect;
  std::optional<transport::Secret> secret;
  std::vector<std::unique_ptr<IslandProcess>> started;

  // The address of island `index` of --connect, or of a new island process
  // named `name` with `accelerators` accelerators.
  std::string Get(size_t index, const std::string& name, int accelerators) {
    if (!connect.empty()) return connect.at(index);
    const std::string cli = EnvString("CAUSEWAY_CLI");
    started.push_back(
        Must(IslandProcess::Start(!cli.empty() ? cli : CAUSEWAY_CLI, name,
                                  {"--device=cpu", absl::StrCat("--accelerators=", accelerators)}),
             "start an island"));
    return started.back()->address();
  }
  std::unique_ptr<Client> Connect(const std::vector<std::string>& addresses) const {
    transport::ControllerOptions options;
    options.name = "island_bench";
    options.secret = secret;
    return Must(client::RemoteClient::Connect(addresses, options), "connect");
  }
};

void AddParameter(ProgramDef& def, const std::string& value, const std::string& mesh, const Shape& shape) {
  ParameterDef* p = def.add_parameters();
  p->set_value(value);
  p->set_mesh(mesh);
  p->mutable_shape()->Add(shape.begin(), shape.end());
}
void AddMesh(ProgramDef& def, const std::string& name, int devices) {
  MeshDef* m = def.add_meshes();
  m->set_name(name);
  m->add_dims(devices);
}

// x on "a" crosses to "b", where a reshard reads it.
ProgramDef TransferDef(int64_t elements) {
  ProgramDef def;
  def.set_name("transfer");
  AddMesh(def, "a", 1);
  AddMesh(def, "b", 1);
  AddParameter(def, "x", "a", {elements});
  NodeDef* n = def.add_nodes();
  n->set_name("copy");
  ReshardDef* r = n->mutable_reshard();
  r->set_mesh("b");
  r->set_input("x");
  r->set_output("y");
  *r->mutable_sharding() = ToDef(Sharding::Split(0));
  def.add_outputs("y");
  return def;
}

// Runs `program` `runs` times back to back, keeping at most `in_flight`
// pending, run k on input set k of `rotation` (cycling); runs per second over
// the timed ones.
double Stream(Client& c, const std::shared_ptr<LoadedProgram>& program,
              const std::vector<std::vector<Array>>& rotation, int runs, int in_flight = 4) {
  size_t next = 0;
  auto one = [&](std::vector<client::Run>& pending) {
    pending.push_back(Must(c.Execute(program, rotation[next]), "execute"));
    next = (next + 1) % rotation.size();
    if (static_cast<int>(pending.size()) > in_flight) {
      CheckOk(pending.front().done.AwaitStatus(absl::Now() + absl::Seconds(60)), "run");
      for (const Array& o : pending.front().outputs) (void)c.Release(o);
      pending.erase(pending.begin());
    }
  };
  std::vector<client::Run> pending;
  one(pending);
  CheckOk(pending.back().done.AwaitStatus(absl::Now() + absl::Seconds(60)), "first run");
  absl::Time start = absl::Now();
  for (int i = 0; i < runs; ++i) one(pending);
  for (client::Run& r : pending) {
    CheckOk(r.done.AwaitStatus(absl::Now() + absl::Seconds(60)), "run");
    for (const Array& o : r.outputs) (void)c.Release(o);
  }
  return runs / absl::ToDoubleSeconds(absl::Now() - start);
}

// Runs queued at once in a transfer sample: Stream keeps kTransferInFlight
// pending besides the one just submitted, so up to kTransferInFlight + 1 are
// unfinished while the controller waits; the streamed TCP baseline keeps as
// many unanswered.
constexpr int kTransferInFlight = 2;
constexpr int kTransferDepth = kTransferInFlight + 1;

void TransferBench(Islands& islands, int samples, const std::vector<uint64_t>& sizes_mib, Report& report) {
  const std::string a = islands.Get(0, "a", 1), b = islands.Get(1, "b", 1);
  std::unique_ptr<Client> c = islands.Connect({a, b});
  Mesh ma = Must(c->AllocateMesh(0, {1}), "mesh"), mb = Must(c->AllocateMesh(1, {1}), "mesh");
  const uint64_t largest = *std::max_element(sizes_mib.begin(), sizes_mib.end());
  auto tcp = TcpBaseline::Start(largest << 20);
  std::printf(
      "transfer between two island processes vs plain TCP between two processes (GB/s, medians of %d);\n"
      "  tcp: streamed, %d transfers unanswered at most (as causeway's runs in flight), sends of up to %llu "
      "MiB;\n"
      "  one-way: no answers (the ceiling); req/reply: each transfer waits for its answer (informative)\n",
      samples, kTransferDepth, static_cast<unsigned long long>(transport::kDataChunkBytes >> 20));
  std::printf("%10s %10s %10s %10s %10s %8s %10s\n", "size", "tcp", "one-way", "req/reply", "causeway",
              "/tcp", "/one-way");
  for (uint64_t mib : sizes_mib) {
    const uint64_t bytes = mib << 20;
    const int64_t elements = static_cast<int64_t>(bytes / 4);
    auto program = Must(c->Load(TransferDef(elements), {{"a", ma}, {"b", mb}}), "load");
    // As many distinct inputs as the TCP baseline has source buffers, used
    // in turn, so that neither side resends bytes a cache still holds.
    const int count = SourceBuffers::CountFor(bytes);
    std::vector<std::vector<Array>> inputs;
    for (int k = 0; k < count; ++k) {
      Array x = Must(c->CreateArray(ma, {elements}, DType::kF32), "array");
      std::vector<float> host = reference::RandomFloats(elements, mib * 100 + k);
      CheckOk(c->Upload(x, host.data(), bytes), "upload");
      // Check once that the bytes arrive intact.
      if (k == 0) {
        client::Run run = Must(c->Execute(program, {x}), "execute");
        CheckOk(run.done.AwaitStatus(absl::Now() + absl::Seconds(60)), "run");
        std::vector<float> got(elements);
        CheckOk(c->Download(run.outputs[0], got.data(), bytes, absl::Now() + absl::Seconds(60)), "download");
        if (std::memcmp(got.data(), host.data(), bytes) != 0)
          CheckOk(absl::DataLossError("bytes differ"), "check");
        (void)c->Release(run.outputs[0]);
      }
      inputs.push_back({x});
    }
    SourceBuffers sources(bytes, count);
    tcp->Check(sources.Next());
    const uint64_t frame = transport::kDataChunkBytes;
    const int transfers = std::max(2, static_cast<int>(transfer_sample_bytes / bytes));
    auto figures = Alternate(
        samples, {
                     [&] { return tcp->Streamed(sources, transfers, kTransferDepth, frame); },
                     [&] { return tcp->OneWay(sources, transfers, frame); },
                     [&] { return tcp->RequestReply(sources, transfers, frame); },
                     [&] { return Stream(*c, program, inputs, transfers, kTransferInFlight) * bytes / 1e9; },
                 });
    const double t = Median(figures[0]), one_way = Median(figures[1]), rr = Median(figures[2]),
                 cw = Median(figures[3]);
    std::printf("%7llu MiB %10.2f %10.2f %10.2f %10.2f %8.2f %10.2f\n", static_cast<unsigned long long>(mib),
                t, one_way, rr, cw, cw / t, cw / one_way);
    report.Add("transfer", absl::StrCat("island transfer ", mib, " MiB"), "GB/s")
        .Value(cw)
        .Baseline("streamed TCP", t)
        .Samples(samples)
        .Param("bytes", static_cast<double>(bytes))
        .Param("transfers_per_sample", transfers)
        .Param("depth", kTransferDepth)
        .Param("distinct_inputs", count)
        .Param("frame_bytes", static_cast<double>(frame))
        .Extra("tcp_one_way_gbps", one_way)
        .Extra("tcp_request_reply_gbps", rr);
    std::fflush(stdout);
    for (const auto& set : inputs) (void)c->Release(set[0]);
  }
}

// A pipeline of `stages` matmul stages on meshes s0..s{stages-1} of one
// device each; the meshes are bound by the caller.
ProgramDef PipelineDef(int stages, int n) {
  ProgramDef def;
  def.set_name("pipeline");
  for (int s = 0; s < stages; ++s) AddMesh(def, absl::StrCat("s", s), 1);
  *def.add_functions() = MatmulDef("mm", n, n, n);
  AddParameter(def, "x0", "s0", {n, n});
  for (int s = 0; s < stages; ++s) {
    AddParameter(def, absl::StrCat("w", s), absl::StrCat("s", s), {n, n});
    NodeDef* node = def.add_nodes();
    node->set_name(absl::StrCat("stage", s));
    CallDef* call = node->mutable_call();
    call->set_function("mm");
    call->set_mesh(absl::StrCat("s", s));
    call->add_inputs(absl::StrCat("x", s));
    call->add_inputs(absl::StrCat("w", s));
    call->add_outputs(absl::StrCat("x", s + 1));
  }
  def.add_outputs(absl::StrCat("x", stages));
  return def;
}

void ProgramBench(Islands& islands, int samples, Report& report) {
  constexpr int kStages = 4, kN = 256;
  const int kRuns = program_runs;
  const std::string a = islands.Get(0, "a", 2), b = islands.Get(1, "b", 2), one = islands.Get(2, "one", 4);
  std::unique_ptr<Client> single = islands.Connect({one});
  std::unique_ptr<Client> pair = islands.Connect({a, b});
  auto setup = [&](Client& c, const std::vector<int>& island_of_stage) {
    absl::flat_hash_map<std::string, Mesh> meshes;
    std::vector<Array> inputs;
    std::vector<Mesh> list;
    for (int s = 0; s < kStages; ++s) {
      list.push_back(Must(c.AllocateMesh(island_of_stage[s], {1}), "mesh"));
      meshes[absl::StrCat("s", s)] = list.back();
    }
    auto program = Must(c.Load(PipelineDef(kStages, kN), meshes), "load");
    std::vector<float> host = reference::RandomFloats(kN * kN, 3, -0.1f, 0.1f);
    for (int i = 0; i <= kStages; ++i) {
      Array arr = Must(c.CreateArray(list[i == 0 ? 0 : i - 1], {kN, kN}, DType::kF32), "array");
      CheckOk(c.Upload(arr, host.data(), host.size() * 4), "upload");
      inputs.push_back(arr);
    }
    return std::make_pair(program, inputs);
  };
  auto [p1, in1] = setup(*single, {0, 0, 0, 0});
  auto [p2, in2] = setup(*pair, {0, 0, 1, 1});
  auto figures = Alternate(samples, {
                                        [&] { return Stream(*single, p1, {in1}, kRuns); },
                                        [&] { return Stream(*pair, p2, {in2}, kRuns); },
                                    });
  const double one_island = Median(figures[0]), two_islands = Median(figures[1]);
  std::printf("program: %d matmul stages (%dx%d), runs streamed (programs/s, medians of %d)\n", kStages, kN, kN,
              samples);
  std::printf("  one island of 4 accelerators   %8.1f\n", one_island);
  std::printf("  two islands of 2 (DCN between) %8.1f   ratio %.2f\n", two_islands, two_islands / one_island);
  report.Add("program", "two islands of 2", "programs/s")
      .Value(two_islands)
      .Baseline("one island of 4", one_island)
      .Samples(samples)
      .Param("stages", kStages)
      .Param("n", kN)
      .Param("runs_per_sample", kRuns);
}

}  // namespace
}  // namespace causeway::bench

int main(int argc, char** argv) {
  using namespace causeway::bench;
  const CommonFlags common = StartBenchmark("causeway_island_bench", argc, argv);
  const int samples = common.SamplesOr(common.quick ? 1 : 9);
  std::vector<uint64_t> sizes = {1, 4, 16, 64, 256};  // MiB
  if (common.quick) {
    sizes = {1};
    transfer_sample_bytes = uint64_t{32} << 20;
    program_runs = 4;
  }
  std::string only, secret_file;
  Islands islands;
  BenchFlags flags;
  flags.Sizes("sizes", &sizes, 1, 1024, "transfer sizes in MiB")
      .Choice("only", &only, {"transfer", "program"}, "run only this table (default: both)")
      .Text(
          "connect", "A,B[,C]",
          [&islands](absl::string_view list) {
            islands.connect = absl::StrSplit(list, ',', absl::SkipWhitespace());
            if (islands.connect.size() < 2 || islands.connect.size() > 3) {
              return std::string("takes two or three HOST:PORT, comma-separated");
            }
            return std::string();
          },
          "run on these running islands (causeway island) instead of starting them")
      .Text(
          "secret-file", "FILE",
          [&secret_file](absl::string_view path) {
            secret_file = std::string(path);
            return path.empty() ? std::string("takes a file name") : std::string();
          },
          "the islands' shared secret (else $CAUSEWAY_SECRET)");
  flags.Parse(argc, argv);
  if (!secret_file.empty()) {
    islands.secret = Must(causeway::transport::Secret::FromFile(secret_file), "--secret-file");
  } else if (absl::StatusOr<causeway::transport::Secret> env = causeway::transport::Secret::FromEnvironment();
             env.ok()) {
    islands.secret = *std::move(env);
  } else if (!absl::IsNotFound(env.status())) {
    CheckOk(env.status(), "CAUSEWAY_SECRET");
  }
  const bool program_table = islands.connect.empty() || islands.connect.size() == 3;
  if (only == "program" && !program_table) Die("--only=program with --connect needs three islands (A,B,C)");
  Report report("island");
  if (only.empty() || only == "transfer") TransferBench(islands, samples, sizes, report);
  if ((only.empty() && program_table) || only == "program") ProgramBench(islands, samples, report);
  if (only.empty() && !program_table) {
    std::printf("program: not run (--connect names two islands; a third, of four accelerators, runs it)\n");
  }
  report.WriteOrDie(common.json);
  return 0;
}

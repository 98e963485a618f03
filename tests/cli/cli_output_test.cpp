// Every file the CLI writes replaces the old one whole or not at all (write_text_file in
// core/json_file.h): a write that fails part-way, here by a file-size limit the shell sets,
// leaves the previous file as it was and no temporary beside it.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kProfile =
    std::string(STASH_SOURCE_DIR) + "/tools/demo/profiles/llama3-8b_h200_b4_s4096.json";

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct run_result {
  int code = -1;
  std::string err;
};

// `stash <args>` with writes limited to `kib` KiB: SIGXFSZ ignored (inherited across exec),
// so a write past the limit fails with EFBIG instead of killing the process. ulimit -f counts
// 512-byte blocks in dash (/bin/sh here) and 1 KiB blocks in bash; every output below is
// larger than its limit counted either way. stderr goes to a file under the same limit, so
// the commands run quietly.
run_result run_limited(const std::string& args, int kib) {
  const std::string dir = ::testing::TempDir();
  const std::string err = dir + "stash_cli_output.err";
  const std::string cmd = "trap '' XFSZ; ulimit -f " + std::to_string(kib * 2) + "; exec " +
                          STASH_CLI_PATH + " " + args + " >/dev/null 2>" + err;
  const int st = std::system(cmd.c_str());
  run_result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

// Names in the folder of `path` that begin with its base name followed by ".tmp.".
std::vector<std::string> temporaries_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = path.substr(0, slash), base = path.substr(slash + 1) + ".tmp.";
  std::vector<std::string> found;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(base, 0) == 0) found.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return found;
}

class CliOutput : public ::testing::Test {
 protected:
  // The old file, then the command that would replace it with more than `kib` KiB.
  void expect_old_file_kept(const std::string& name, const std::string& args_before_path,
                            int kib = 4) {
    const std::string path = ::testing::TempDir() + "stash_cli_output_" + name;
    const std::string old = "the previous " + name + "\n";
    std::ofstream(path) << old;
    const run_result r = run_limited(args_before_path + " " + path, kib);
    EXPECT_EQ(r.code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find(path + ": write failed"), std::string::npos) << name << ": " << r.err;
    EXPECT_EQ(slurp(path), old) << name << ": the old file was not kept whole";
    EXPECT_EQ(temporaries_of(path), std::vector<std::string>{}) << name;
    std::remove(path.c_str());
  }
};

}  // namespace

TEST_F(CliOutput, ProfileModelKeepsTheOldProfile) {
  expect_old_file_kept("profile.json",
                       "profile-model --arch llama3-8b --device h200 --batch 4 --seq 4096 -o");
}

TEST_F(CliOutput, PlanKeepsTheOldPlan) {
  expect_old_file_kept("plan.json", "plan --profile " + kProfile + " --budget 70% -o");
}

TEST_F(CliOutput, SimulateKeepsTheOldTraceAndPlot) {
  const std::string plan = ::testing::TempDir() + "stash_cli_output_input_plan.json";
  ASSERT_EQ(std::system((std::string(STASH_CLI_PATH) + " plan --profile " + kProfile +
                         " --budget 70% -o " + plan + " >/dev/null")
                            .c_str()),
            0);
  const std::string head = "simulate --profile " + kProfile + " --plan " + plan;
  expect_old_file_kept("trace.json", head + " --trace");
  expect_old_file_kept("memory.svg", head + " --memory-svg");
  std::remove(plan.c_str());
}

TEST_F(CliOutput, ParetoKeepsTheOldPlot) {
  expect_old_file_kept("pareto.svg", "pareto -q --points 4 --profile " + kProfile + " --svg", 1);
}

// The limit itself works: the same command without it writes the file.
TEST_F(CliOutput, WithoutTheLimitTheFileIsReplaced) {
  const std::string path = ::testing::TempDir() + "stash_cli_output_unlimited.json";
  std::ofstream(path) << "old\n";
  const run_result r = run_limited(
      "profile-model --arch llama3-8b --device h200 --batch 4 --seq 4096 -o " + path, 1 << 20);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(slurp(path).find("stash.profile/1"), std::string::npos);
  std::remove(path.c_str());
}

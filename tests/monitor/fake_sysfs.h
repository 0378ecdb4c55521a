// A fake /sys/class/infiniband in a temporary directory, for the monitor's
// tests: devices, ports, counter files whose contents a test rewrites in
// place (the monitor keeps them open and re-reads them with pread, so a
// rewrite must keep the inode: truncate and write, never replace).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace slotrpc::test {

class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/slotrpc-fake-sysfs-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    scratch_ = tmpl;
    root_ = scratch_ + "/infiniband";
    std::filesystem::create_directory(root_);
  }
  ~FakeSysfs() {
    std::error_code ec;
    std::filesystem::remove_all(scratch_, ec);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  // The fake /sys/class/infiniband.
  const std::string& root() const { return root_; }
  // A directory beside it for a test's own files.
  const std::string& scratch() const { return scratch_; }

  std::string dir(const std::string& device, int port, const std::string& sub) const {
    return root_ + "/" + device + "/ports/" + std::to_string(port) + "/" + sub;
  }
  // Writes (or rewrites in place) ports/<port>/<sub>/<name>.
  void set(const std::string& device, int port, const std::string& sub, const std::string& name,
           const std::string& content) const {
    std::filesystem::create_directories(dir(device, port, sub));
    std::ofstream f(dir(device, port, sub) + "/" + name, std::ios::trunc);
    f << content;
  }
  void set(const std::string& device, int port, const std::string& name, uint64_t value) const {
    set(device, port, "hw_counters", name, std::to_string(value) + "\n");
  }
  // A port directory with no counter directories at all.
  void bare_port(const std::string& device, int port) const {
    std::filesystem::create_directories(root_ + "/" + device + "/ports/" + std::to_string(port));
  }
  void symlink(const std::string& device, int port, const std::string& sub, const std::string& name,
               const std::string& target) const {
    std::filesystem::create_directories(dir(device, port, sub));
    std::filesystem::create_symlink(target, dir(device, port, sub) + "/" + name);
  }

 private:
  std::string scratch_;
  std::string root_;
};

}  // namespace slotrpc::test

// `tessera report RUN_DIR`: one self-contained HTML page of a run (docs/training_loop.md, "Run
// report"): the resolved config, every metrics.jsonl series as a curve, each rank's memory by
// kind and seconds per phase (ranks.json), eval renders beside their targets (renders/), sample
// point clouds (samples/) and the warnings of the ranks' logs. Everything the page shows is
// embedded in it (images as data: URIs, the script inline), so it opens without a network and
// can be mailed or attached to a ticket. Needs no MPI; reads a finished, stopped or running run.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

struct ReportOptions {
  std::string run_dir;          // a folder `tessera train` wrote (metrics.jsonl at least)
  std::string out;              // "" = RUN_DIR/report.html
  int64_t eval_steps = 6;       // eval steps whose renders are embedded: the last and earlier ones spread
  int64_t views = 8;            // views embedded per eval step (the first ones)
  int64_t samples = 8;          // sample point clouds shown (the first ones)
  int64_t sample_points = 2048; // points drawn per sample, spread over its points
  // metrics.jsonl records drawn: beyond this many, every k-th (about this many) plus every eval
  // record and the last; 0 = all.
  int64_t max_records = 5000;
};

struct ReportSummary {
  std::string path;            // the page written
  int64_t records = 0;         // metrics.jsonl step records
  int64_t records_shown = 0;   // of those, drawn (options.max_records)
  int64_t skipped_lines = 0;   // metrics.jsonl lines that were not JSON (a run writing its last)
  int64_t eval_steps = 0;      // eval steps with renders embedded
  int64_t images = 0;          // PNGs embedded (renders and targets)
  int64_t samples = 0;         // point clouds embedded
  int64_t ranks = 0;           // ranks in ranks.json (0: none)
  int64_t bytes = 0;           // size of the page
};

// Reads the run and writes the page atomically (OUT.partial renamed into place); under a second
// for a run of thousands of records. Throws UserError for a folder that is not a run (no
// metrics.jsonl) or an --out in a missing folder, with nothing written.
ReportSummary write_run_report(const ReportOptions& options);

// The page's template: HTML with the placeholder TESSERA_REPORT_DATA where the run's JSON goes
// (report_page.html, embedded at build time).
const char* report_page_template();

}  // namespace tessera

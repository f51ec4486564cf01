// A line chart as plain SVG text, readable in a browser: one or more panels
// stacked vertically over a shared x axis, each with its own y axis, ticks,
// legend and an optional dashed threshold line. Nothing but the standard
// library and absl, so that tools can write plots without a plotting stack.
//
// Example:
//   nibble::client::Plot plot;
//   plot.title = "nibble-load sweep";
//   plot.x_label = "offered requests/s";
//   nibble::client::PlotPanel& latency = plot.panels.emplace_back();
//   latency.y_label = "latency ms";
//   latency.series.push_back({"p99", {{50, 1.2}, {100, 3.4}}});
//   latency.threshold = 10;
//   latency.threshold_label = "SLO 10 ms";
//   std::string svg = nibble::client::PlotSvg(plot);
#ifndef NIBBLE_CLIENT_SVG_PLOT_H_
#define NIBBLE_CLIENT_SVG_PLOT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace nibble {
namespace client {

struct PlotSeries {
  std::string label;
  // (x, y) in the order they are joined; non-finite points are skipped.
  std::vector<std::pair<double, double>> points;
};

struct PlotPanel {
  std::string y_label;
  std::vector<PlotSeries> series;
  // Drawn dashed across the panel, and the y axis stretched to show it.
  std::optional<double> threshold;
  std::string threshold_label;
};

struct Plot {
  std::string title;
  std::string x_label;
  std::vector<PlotPanel> panels;
};

// The whole SVG document. Each series is one <polyline> with a marker per
// point; y axes start at 0, the x axis spans the points.
std::string PlotSvg(const Plot& plot);

// `text` with &, <, >, " and ' escaped for XML text and attributes.
std::string XmlEscape(absl::string_view text);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_SVG_PLOT_H_

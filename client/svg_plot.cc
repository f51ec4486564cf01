#include "client/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace nibble {
namespace client {
namespace {

// Pixels. Panels are stacked, with room below each for its x tick labels.
constexpr double kWidth = 760;
constexpr double kLeft = 80;
constexpr double kRight = 180;
constexpr double kTop = 50;
constexpr double kPanelHeight = 240;
constexpr double kPanelGap = 70;
constexpr double kBottom = 20;

constexpr absl::string_view kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                         "#ff7f0e", "#9467bd", "#8c564b"};

// Round tick values (1, 2 or 5 times a power of ten apart) covering about
// [low, high] in some five steps.
std::vector<double> Ticks(double low, double high) {
  const double raw = (high - low) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double normalized = raw / magnitude;
  const double step = magnitude * (normalized <= 1   ? 1
                                   : normalized <= 2 ? 2
                                   : normalized <= 5 ? 5
                                                     : 10);
  std::vector<double> ticks;
  const double first = std::ceil(low / step - 1e-9);
  for (double i = first; i * step <= high + step * 1e-9; ++i) {
    // Adding 0 turns -0, which ceil gives just below 0, into 0.
    ticks.push_back(i * step + 0.0);
  }
  return ticks;
}

// A linear map from data to pixels.
struct Scale {
  double low;
  double high;
  double pixel_low;
  double pixel_high;

  double operator()(double value) const {
    return pixel_low + (value - low) / (high - low) * (pixel_high - pixel_low);
  }
};

bool Finite(const std::pair<double, double>& point) {
  return std::isfinite(point.first) && std::isfinite(point.second);
}

std::string Number(double value) { return absl::StrFormat("%.1f", value); }

std::string Text(double x, double y, absl::string_view anchor,
                 absl::string_view text, absl::string_view extra = "") {
  return absl::StrCat("<text x=\"", Number(x), "\" y=\"", Number(y),
                      "\" text-anchor=\"", anchor, "\"", extra, ">",
                      XmlEscape(text), "</text>\n");
}

std::string Line(double x1, double y1, double x2, double y2,
                 absl::string_view style) {
  return absl::StrCat("<line x1=\"", Number(x1), "\" y1=\"", Number(y1),
                      "\" x2=\"", Number(x2), "\" y2=\"", Number(y2), "\" ",
                      style, "/>\n");
}

// The x range of all the panels' points, widened when they share one x.
std::pair<double, double> XRange(const Plot& plot) {
  double low = INFINITY;
  double high = -INFINITY;
  for (const PlotPanel& panel : plot.panels) {
    for (const PlotSeries& series : panel.series) {
      for (const auto& point : series.points) {
        if (!Finite(point)) continue;
        low = std::min(low, point.first);
        high = std::max(high, point.first);
      }
    }
  }
  if (!(low <= high)) return {0, 1};
  if (low == high) {
    const double pad = low == 0 ? 1 : std::abs(low) / 2;
    return {low - pad, high + pad};
  }
  return {low, high};
}

std::string PanelSvg(const PlotPanel& panel, const Scale& x, double top,
                     bool last, absl::string_view x_label) {
  const double bottom = top + kPanelHeight;
  const double right = kWidth - kRight;
  double y_max = panel.threshold.value_or(0);
  for (const PlotSeries& series : panel.series) {
    for (const auto& point : series.points) {
      if (Finite(point)) y_max = std::max(y_max, point.second);
    }
  }
  if (!(y_max > 0)) y_max = 1;
  std::vector<double> y_ticks = Ticks(0, y_max);
  // Up to the first tick at or above the data, so the top is labelled.
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : y_max;
  const double y_top = std::ceil(y_max / y_step - 1e-9) * y_step;
  if (y_ticks.back() < y_top - y_step * 1e-9) y_ticks.push_back(y_top);
  const Scale y{0, y_top, bottom, top};

  std::string svg = "<g>\n";
  for (double tick : y_ticks) {
    svg += Line(kLeft, y(tick), right, y(tick), "stroke=\"#e0e0e0\"");
    svg += Text(kLeft - 6, y(tick) + 4, "end", absl::StrFormat("%g", tick));
  }
  for (double tick : Ticks(x.low, x.high)) {
    if (tick < x.low - 1e-9 * (x.high - x.low)) continue;
    svg += Line(x(tick), bottom, x(tick), bottom + 5, "stroke=\"black\"");
    svg += Text(x(tick), bottom + 18, "middle", absl::StrFormat("%g", tick));
  }
  svg += Line(kLeft, top, kLeft, bottom, "stroke=\"black\"");
  svg += Line(kLeft, bottom, right, bottom, "stroke=\"black\"");
  svg += Text(kLeft - 55, (top + bottom) / 2, "middle", panel.y_label,
              absl::StrFormat(" transform=\"rotate(-90 %s %s)\"",
                              Number(kLeft - 55), Number((top + bottom) / 2)));
  if (last) {
    svg += Text((kLeft + right) / 2, bottom + 40, "middle", x_label);
  }

  double legend_y = top + 10;
  const double legend_x = right + 15;
  if (panel.threshold.has_value()) {
    constexpr absl::string_view kDashed =
        "stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"";
    svg +=
        Line(kLeft, y(*panel.threshold), right, y(*panel.threshold), kDashed);
    svg += Line(legend_x, legend_y, legend_x + 25, legend_y, kDashed);
    svg += Text(legend_x + 30, legend_y + 4, "start", panel.threshold_label);
    legend_y += 20;
  }
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const PlotSeries& series = panel.series[i];
    const absl::string_view color = kColors[i % std::size(kColors)];
    std::vector<std::string> points;
    std::string markers;
    for (const auto& point : series.points) {
      if (!Finite(point)) continue;
      const std::string px = Number(x(point.first));
      const std::string py = Number(y(point.second));
      points.push_back(absl::StrCat(px, ",", py));
      absl::StrAppend(&markers, "<circle cx=\"", px, "\" cy=\"", py,
                      "\" r=\"3\" fill=\"", color, "\"/>\n");
    }
    absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color,
                    "\" stroke-width=\"2\" points=\"",
                    absl::StrJoin(points, " "), "\"/>\n", markers);
    svg += Line(legend_x, legend_y, legend_x + 25, legend_y,
                absl::StrCat("stroke=\"", color, "\" stroke-width=\"2\""));
    svg += Text(legend_x + 30, legend_y + 4, "start", series.label);
    legend_y += 20;
  }
  svg += "</g>\n";
  return svg;
}

}  // namespace

std::string XmlEscape(absl::string_view text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&apos;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

std::string PlotSvg(const Plot& plot) {
  const double height =
      kTop + plot.panels.size() * (kPanelHeight + kPanelGap) + kBottom;
  const auto [x_low, x_high] = XRange(plot);
  const Scale x{x_low, x_high, kLeft, kWidth - kRight};
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      static_cast<int>(kWidth), static_cast<int>(height),
      static_cast<int>(kWidth), static_cast<int>(height));
  svg += Text(kWidth / 2, 28, "middle", plot.title,
              " font-size=\"15\" font-weight=\"bold\"");
  for (size_t i = 0; i < plot.panels.size(); ++i) {
    svg += PanelSvg(plot.panels[i], x, kTop + i * (kPanelHeight + kPanelGap),
                    i + 1 == plot.panels.size(), plot.x_label);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace client
}  // namespace nibble

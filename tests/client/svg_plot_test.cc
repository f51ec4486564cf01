#include "client/svg_plot.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Whether every element in `svg` is closed in order, and every '<' and '&'
// in text starts a tag or an entity.
::testing::AssertionResult WellFormed(const std::string& svg) {
  std::vector<std::string> open;
  for (size_t at = 0; at < svg.size(); ++at) {
    if (svg[at] == '&') {
      const size_t semicolon = svg.find(';', at);
      if (semicolon == std::string::npos || semicolon - at > 6) {
        return ::testing::AssertionFailure() << "bare & at " << at;
      }
      continue;
    }
    if (svg[at] != '<') continue;
    const size_t end = svg.find('>', at);
    if (end == std::string::npos) {
      return ::testing::AssertionFailure() << "unclosed tag at " << at;
    }
    const std::string tag = svg.substr(at + 1, end - at - 1);
    at = end;
    if (tag.empty() || tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        return ::testing::AssertionFailure()
               << "stray </" << tag.substr(1) << ">";
      }
      open.pop_back();
      continue;
    }
    if (tag.find('<') != std::string::npos) {
      return ::testing::AssertionFailure() << "'<' inside tag " << tag;
    }
    if (tag.back() == '/') continue;
    open.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  if (!open.empty()) {
    return ::testing::AssertionFailure()
           << "<" << open.back() << "> never closed";
  }
  return ::testing::AssertionSuccess();
}

int Count(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

Plot SweepPlot() {
  Plot plot;
  plot.title = "sweep of <w> & \"m\"=1";
  plot.x_label = "offered requests/s";
  PlotPanel& throughput = plot.panels.emplace_back();
  throughput.y_label = "requests/s";
  throughput.series.push_back(
      {"throughput", {{50, 49}, {100, 98}, {150, 120}}});
  PlotPanel& latency = plot.panels.emplace_back();
  latency.y_label = "latency ms";
  latency.series.push_back({"p50", {{50, 1}, {100, 1.5}, {150, 9}}});
  latency.series.push_back({"p99", {{50, 2}, {100, 4}, {150, 30}}});
  latency.threshold = 10;
  latency.threshold_label = "SLO 10 ms";
  return plot;
}

TEST(SvgPlotTest, WritesWellFormedSvg) {
  const std::string svg = PlotSvg(SweepPlot());
  EXPECT_TRUE(WellFormed(svg)) << svg;
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
}

TEST(SvgPlotTest, DrawsEachSeriesAsAPolyline) {
  const std::string svg = PlotSvg(SweepPlot());
  EXPECT_EQ(Count(svg, "<polyline"), 3) << svg;
  EXPECT_EQ(Count(svg, "<circle"), 9) << svg;
  for (const char* label : {">throughput<", ">p50<", ">p99<"}) {
    EXPECT_THAT(svg, HasSubstr(label));
  }
}

TEST(SvgPlotTest, DrawsTheThresholdDashed) {
  const std::string svg = PlotSvg(SweepPlot());
  // The line across the panel and its legend entry.
  EXPECT_EQ(Count(svg, "stroke-dasharray"), 2) << svg;
  EXPECT_THAT(svg, HasSubstr(">SLO 10 ms<"));
}

TEST(SvgPlotTest, LabelsTicks) {
  const std::string svg = PlotSvg(SweepPlot());
  for (const char* tick : {">50<", ">100<", ">150<", ">0<", ">30<"}) {
    EXPECT_THAT(svg, HasSubstr(tick)) << svg;
  }
}

TEST(SvgPlotTest, EscapesText) {
  const std::string svg = PlotSvg(SweepPlot());
  EXPECT_THAT(svg, HasSubstr("sweep of &lt;w&gt; &amp; &quot;m&quot;=1"));
  EXPECT_THAT(svg, Not(HasSubstr("<w>")));
  EXPECT_EQ(XmlEscape("a<b>&'\""), "a&lt;b&gt;&amp;&apos;&quot;");
}

TEST(SvgPlotTest, HandlesASinglePointAndNoData) {
  Plot plot;
  plot.title = "one";
  PlotPanel& panel = plot.panels.emplace_back();
  panel.series.push_back({"only", {{50, 3}}});
  panel.series.push_back({"none", {}});
  const std::string svg = PlotSvg(plot);
  EXPECT_TRUE(WellFormed(svg)) << svg;
  EXPECT_EQ(Count(svg, "<polyline"), 2);
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
}

}  // namespace
}  // namespace client
}  // namespace nibble

// A few lines of SVG for the tour's pictures: a heatmap and a line chart.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace tour {

// Writes w (rows × cols, values in [0, 1]) as a grid of grey squares.
inline bool heatmap_svg(const std::string& path, const std::string& title, const std::vector<double>& w,
                        std::size_t rows, std::size_t cols) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const int cell = 12, top = 30;
  std::fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%zu\" height=\"%zu\">\n", cols * cell + 20,
               rows * cell + top + 10);
  std::fprintf(f, "<text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"13\">%s</text>\n", title.c_str());
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      const int level = 255 - int(std::clamp(w[i * cols + j], 0.0, 1.0) * 255);
      std::fprintf(f, "<rect x=\"%zu\" y=\"%zu\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,255)\"/>\n",
                   10 + j * cell, top + i * cell, cell, cell, level, level);
    }
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

struct series {
  std::string name, colour;
  std::vector<double> y;
};

// A line chart over x (drawn on a log₂ axis), y from 0 to the largest value.
inline bool line_chart_svg(const std::string& path, const std::string& title, const std::string& y_label,
                           const std::vector<double>& x, const std::vector<series>& lines,
                           const std::string& x_label = "T") {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const double W = 520, H = 300, left = 60, bottom = 40, top = 30, right = 150;
  double ymax = 0;
  for (const series& s : lines) ymax = std::max(ymax, *std::max_element(s.y.begin(), s.y.end()));
  auto px = [&](std::size_t k) { return left + (W - left - right) * double(k) / double(std::max<std::size_t>(1, x.size() - 1)); };
  auto py = [&](double v) { return H - bottom - (H - bottom - top) * (ymax > 0 ? v / ymax : 0); };
  std::fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  std::fprintf(f, "<text x=\"%g\" y=\"18\" font-size=\"13\">%s</text>\n", left, title.c_str());
  std::fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", left, H - bottom, W - right, H - bottom);
  std::fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", left, top, left, H - bottom);
  std::fprintf(f, "<text x=\"5\" y=\"%g\">%.3g</text><text x=\"5\" y=\"%g\">0</text>\n", top + 4, ymax, H - bottom);
  std::fprintf(f, "<text x=\"5\" y=\"%g\" transform=\"rotate(-90 12 %g)\">%s</text>\n", H / 2, H / 2, y_label.c_str());
  for (std::size_t k = 0; k < x.size(); ++k)
    std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%g</text>\n", px(k), H - bottom + 16, x[k]);
  std::fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", (left + W - right) / 2, H - 6,
               x_label.c_str());
  for (std::size_t s = 0; s < lines.size(); ++s) {
    std::string pts;
    for (std::size_t k = 0; k < lines[s].y.size(); ++k) pts += std::to_string(px(k)) + "," + std::to_string(py(lines[s].y[k])) + " ";
    std::fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", lines[s].colour.c_str(), pts.c_str());
    std::fprintf(f, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", W - right + 10, top + 16 + 16 * double(s),
                 lines[s].colour.c_str(), lines[s].name.c_str());
  }
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

}  // namespace tour

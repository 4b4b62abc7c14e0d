// libkiln_plot: a plot's panels drawn with cairo and written as PNG, loaded by write_plot
// (plot.cpp) when `kiln` plots. cairo needs X11's client libraries; keeping it in this module
// lets `kiln` start where they are not installed (a slim container), and only plotting needs them.
#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>

#include "io/plot.hpp"
#include "io/plot_module.hpp"

namespace kiln::io {
namespace {

constexpr double kTwoPi = 6.283185307179586;

const double kColors[][3] = {{0.12, 0.47, 0.71}, {1.0, 0.5, 0.05},  {0.17, 0.63, 0.17},
                             {0.84, 0.15, 0.16}, {0.58, 0.4, 0.74}, {0.55, 0.34, 0.29}};

void draw_panel(cairo_t* cr, const Panel& panel, double top, double width, double height) {
  const double left = 80, right = width - 20, plot_top = top + 30, bottom = top + height - 45;
  const Axis xa = x_axis(panel), ya = y_axis(panel);
  auto px = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * (right - left); };
  auto py = [&](double y) { return bottom - (y - ya.lo) / (ya.hi - ya.lo) * (bottom - plot_top); };

  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_font_size(cr, 15);
  cairo_move_to(cr, left, top + 20);
  cairo_show_text(cr, panel.title.c_str());
  cairo_set_font_size(cr, 11);
  cairo_set_line_width(cr, 1);
  for (double t : xa.ticks) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, px(t), plot_top);
    cairo_line_to(cr, px(t), bottom);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    const std::string text = fmt::format("{:g}", t);
    cairo_move_to(cr, px(t) - 3.0 * static_cast<double>(text.size()), bottom + 14);
    cairo_show_text(cr, text.c_str());
  }
  for (double t : ya.ticks) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, left, py(t));
    cairo_line_to(cr, right, py(t));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    const std::string text = fmt::format("{:.4g}", t);
    cairo_move_to(cr, left - 8 - 6.0 * static_cast<double>(text.size()), py(t) + 4);
    cairo_show_text(cr, text.c_str());
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, left, plot_top, right - left, bottom - plot_top);
  cairo_stroke(cr);
  cairo_move_to(cr, (left + right) / 2 - 20, bottom + 32);
  cairo_show_text(cr, panel.x_label.c_str());
  cairo_move_to(cr, 8, plot_top - 8);
  cairo_show_text(cr, panel.y_label.c_str());

  cairo_set_line_width(cr, 1.6);
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const Series& s = panel.series[i];
    const double* c = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    bool pen_down = false;
    for (size_t k = 0; k < std::min(s.x.size(), s.y.size()); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k])) {
        pen_down = false;  // a gap, not a line through a missing value
        continue;
      }
      if (pen_down) {
        cairo_line_to(cr, px(s.x[k]), py(s.y[k]));
      } else {
        cairo_move_to(cr, px(s.x[k]), py(s.y[k]));
      }
      pen_down = true;
    }
    cairo_stroke(cr);
    if (s.markers) {
      for (size_t k = 0; k < std::min(s.x.size(), s.y.size()); ++k) {
        if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k])) continue;
        cairo_new_sub_path(cr);
        cairo_arc(cr, px(s.x[k]), py(s.y[k]), 3.0, 0, kTwoPi);
      }
      cairo_fill(cr);
    }
    // Legend, top right.
    const double ly = plot_top + 16 + 16 * static_cast<double>(i);
    cairo_move_to(cr, right - 170, ly - 4);
    cairo_line_to(cr, right - 150, ly - 4);
    cairo_stroke(cr);
    cairo_move_to(cr, right - 145, ly);
    cairo_show_text(cr, s.label.c_str());
  }
}

void write_png(const std::string& path, const std::vector<Panel>& panels, int width,
               int panel_height) {
  const int height = panel_height * static_cast<int>(std::max<size_t>(1, panels.size()));
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy);
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()), cairo_destroy);
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  for (size_t i = 0; i < panels.size(); ++i) {
    draw_panel(cr.get(), panels[i], static_cast<double>(i) * panel_height, width, panel_height);
  }
  const cairo_status_t status = cairo_surface_write_to_png(surface.get(), path.c_str());
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error(path + ": cannot write PNG: " + cairo_status_to_string(status));
  }
}

}  // namespace
}  // namespace kiln::io

extern "C" __attribute__((visibility("default"))) int kiln_plot_write_png(
    const kiln::io::PlotRequest* request, char* error, size_t error_size) {
  try {
    kiln::io::write_png(*request->path, *request->panels, request->width, request->panel_height);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
  } catch (...) {
    std::snprintf(error, error_size, "unknown error");
  }
  return 1;
}

//! A plotters bitmap backend whose text is laid out properly with ab_glyph (plotters 0.3.7's own ab_glyph text drops side bearings, so words run together).
use ab_glyph::{point, Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

type Error = <BitMapBackend<'static> as DrawingBackend>::ErrorType;
type DrawResult = Result<(), DrawingErrorKind<Error>>;

/// Everything goes to the bitmap backend except `draw_text`, which places each glyph at its pen
/// position with its bearings and kerning. Text sizes (`estimate_text_size`, legends) still come
/// from plotters' ab_glyph layout of the same font, which sums the same advances and kerning.
pub(crate) struct TextBackend<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> TextBackend<'a> {
    pub(crate) fn new(inner: BitMapBackend<'a>, font: FontRef<'static>) -> TextBackend<'a> {
        TextBackend { inner, font }
    }
}

impl DrawingBackend for TextBackend<'_> {
    type ErrorType = Error;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> DrawResult {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> DrawResult {
        self.inner.present()
    }
    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> DrawResult {
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> DrawResult {
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> DrawResult {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> DrawResult {
        self.inner.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> DrawResult {
        self.inner.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> DrawResult {
        self.inner.fill_polygon(vert, style)
    }
    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> DrawResult {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> DrawResult {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let size = style.size() as f32;
        let font = self.font.as_scaled(PxScale::from(size));
        // The layout box plotters reserves: advances + kerning wide, size / 1.24 high.
        let (width, height) = self.estimate_text_size(text, style)?;
        let (width, height) = (width as i32, height as i32);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        // Baseline one cap height below the box top: capitals fill the box, descenders hang
        // just below it, as in plotters' other font backends.
        let cap = self
            .font
            .outline_glyph(font.scaled_glyph('H'))
            .map(|g| -g.px_bounds().min.y)
            .unwrap_or(size * 0.63);
        let trans = style.transform();
        let (w, h) = self.get_size();
        let mut caret = 0.0f32;
        let mut prev = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                caret += font.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(size, point(caret, cap));
            caret += font.h_advance(id);
            let Some(outline) = self.font.outline_glyph(glyph) else {
                continue; // a space
            };
            let b = outline.px_bounds();
            let mut pixels = Vec::new();
            outline.draw(|x, y, cov| {
                pixels.push((b.min.x as i32 + x as i32, b.min.y as i32 + y as i32, cov))
            });
            for (x, y, cov) in pixels {
                let (x, y) = trans.transform(x + dx, y + dy);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if cov > 0.0 && x >= 0 && y >= 0 && x < w as i32 && y < h as i32 {
                    let alpha = color.alpha * cov.min(1.0) as f64;
                    self.inner.draw_pixel(
                        (x, y),
                        BackendColor {
                            alpha,
                            rgb: color.rgb,
                        },
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::TextBackend;
    use ab_glyph::{Font, PxScale, ScaleFont};
    use plotters::prelude::*;

    /// Leftmost dark column in each run of ink along the text row, left to right.
    fn ink_starts(rgb: &[u8], w: usize, h: usize) -> Vec<usize> {
        let dark: Vec<bool> = (0..w)
            .map(|x| (0..h).any(|y| rgb[(y * w + x) * 3] < 128))
            .collect();
        (0..w)
            .filter(|&x| dark[x] && (x == 0 || !dark[x - 1]))
            .collect()
    }

    /// Glyphs start at pen position + left bearing, words keep their space.
    #[test]
    fn glyphs_sit_at_their_pen_positions() {
        let font = crate::plot::font().unwrap();
        let (w, h) = (200u32, 60u32);
        let mut rgb = vec![255u8; (w * h * 3) as usize];
        {
            let area = TextBackend::new(BitMapBackend::with_buffer(&mut rgb, (w, h)), font.clone())
                .into_drawing_area();
            let style = ("sans-serif", 40.0).into_font().color(&BLACK);
            area.draw_text("l l", &style, (10, 5)).unwrap();
        }
        let sf = font.as_scaled(PxScale::from(40.0));
        let (l, space) = (sf.glyph_id('l'), sf.glyph_id(' '));
        let lsb = sf.h_side_bearing(l);
        let first = 10.0 + lsb;
        let second = 10.0
            + sf.h_advance(l)
            + sf.kern(l, space)
            + sf.h_advance(space)
            + sf.kern(space, l)
            + lsb;
        assert!(
            lsb > 2.0,
            "DejaVu's l has a visible left bearing at 40 px: {lsb}"
        );
        let starts = ink_starts(&rgb, w as usize, h as usize);
        assert_eq!(starts.len(), 2, "{starts:?}");
        assert!(
            (starts[0] as f32 - first).abs() <= 1.0,
            "{starts:?} vs {first}"
        );
        assert!(
            (starts[1] as f32 - second).abs() <= 1.0,
            "{starts:?} vs {second}"
        );
    }
}
